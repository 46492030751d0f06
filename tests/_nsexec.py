"""Run a command with directories hidden behind private, empty tmpfs mounts (a test node that shares no disk).

    unshare --mount --propagation private -- python tests/_nsexec.py \\
        --hide /root --hide /tmp --keep /root/.pyenv/versions/3.11.7 --keep /tmp/vtw123 -- python -m ray.scripts.scripts start ...

Inside the new mount namespace (``unshare`` made it; this script refuses to run in its parent's):

1. every ``--keep`` path is opened (O_PATH) before anything is hidden;
2. every ``--hide`` directory gets a fresh, empty tmpfs over it (mode 1777 for /tmp, 0700 otherwise);
3. every kept path that lay under a hidden directory is bind-mounted back from the descriptor opened in 1
   (``/proc/self/fd/N`` still resolves to the original directory), so the Python install, the repository
   (an editable install) and the node's own Ray temp dir stay at their usual paths;
4. exec the command.

The mounts live as long as the namespace's last process: nothing to unmount, and the host never sees them.
The processes stay in the host's PID and network namespaces: they are stopped by pid and reached over TCP.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import sys

MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2), raising OSError on failure."""
    encode = lambda s: None if s is None else s.encode()
    if _libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount({source!r}, {target!r}, {fstype!r}): {os.strerror(err)}")


def under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hide", action="append", default=[], help="directory to cover with an empty tmpfs")
    p.add_argument("--keep", action="append", default=[], help="path under a hidden directory to keep visible")
    p.add_argument("--tmpfs-size", default="2g")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no command")
    if os.readlink("/proc/self/ns/mnt") == os.readlink(f"/proc/{os.getppid()}/ns/mnt"):
        sys.exit("_nsexec.py: refusing to mount in the parent's mount namespace (run it under `unshare --mount`)")
    hides = sorted({os.path.realpath(h) for h in args.hide}, key=len)
    keeps = sorted({os.path.realpath(k) for k in args.keep if os.path.exists(k)}, key=len)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates back
    held = {k: os.open(k, os.O_PATH) for k in keeps if any(under(k, h) for h in hides)}
    for h in hides:
        mode = "1777" if h == "/tmp" else "0700"
        mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, f"size={args.tmpfs_size},mode={mode}")
    for k, fd in held.items():  # shortest first: an outer keep is bound before an inner one
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(k, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(k), exist_ok=True)
            open(k, "a").close()
        mount(f"/proc/self/fd/{fd}", k, None, MS_BIND | MS_REC)
        os.close(fd)
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
