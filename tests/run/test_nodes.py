"""Storage a cluster shares: URIs with filesystem options, the driver reading files through the same pyarrow
filesystem as the trials, and the checks that a local path is shared and which of the driver's files the nodes
lack (unit tests; tests/run/test_share_nothing.py runs them on nodes that share no disk)."""

from __future__ import annotations

import pyarrow.fs
import pytest

from vitplast_tune import storage
from vitplast_tune.data import staging
from vitplast_tune.errors import UserError
from vitplast_tune.run.cluster import alive_nodes
from vitplast_tune.run.nodes import check_storage, on_every_node, sees, to_stage

MINIO = "s3://bucket/searches?endpoint_override=127.0.0.1:9000&scheme=http"


def test_a_uri_is_joined_before_its_query_and_a_path_as_a_path(tmp_path):
    assert storage.join(MINIO, "name") == "s3://bucket/searches/name?endpoint_override=127.0.0.1:9000&scheme=http"
    assert storage.join("s3://bucket/dir/", "a", "b/") == "s3://bucket/dir/a/b"
    assert storage.join(str(tmp_path), "name") == str(tmp_path / "name")
    assert storage.storage_uri("s3://bucket/dir/?region=eu-west-1") == "s3://bucket/dir?region=eu-west-1"


def test_the_filesystem_of_a_uri_keeps_its_endpoint_and_a_path_is_local(tmp_path):
    fs, path = storage.filesystem(MINIO)  # builds the client only: nothing is contacted
    assert isinstance(fs, pyarrow.fs.S3FileSystem) and path == "bucket/searches"
    options = fs.__reduce__()[1][0]  # what travels when Ray pickles it to a trial
    assert options["endpoint_override"] == "127.0.0.1:9000" and options["scheme"] == "http"
    fs, path = storage.filesystem(str(tmp_path))
    assert isinstance(fs, pyarrow.fs.LocalFileSystem) and path == str(tmp_path)


def test_download_copies_one_file_through_a_filesystem(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "best.safetensors").write_bytes(b"weights")
    (tmp_path / "out").mkdir()
    got = storage.download(pyarrow.fs.LocalFileSystem(), str(tmp_path / "ckpt" / "best.safetensors"), tmp_path / "out")
    assert got == tmp_path / "out" / "best.safetensors" and got.read_bytes() == b"weights"
    with pytest.raises(FileNotFoundError):
        storage.download(pyarrow.fs.LocalFileSystem(), str(tmp_path / "ckpt" / "none"), tmp_path / "out")


def view(marker, *inputs):
    return {"marker": marker, "inputs": list(inputs)}


def test_a_local_storage_path_a_node_cannot_see_is_refused_with_what_to_do(library_log):
    views = {"10.0.0.1 (node a)": view("token"), "10.0.0.2 (node b)": view(None), "10.0.0.3 (node c)": None}
    with pytest.raises(UserError) as error:
        check_storage("/data/results", views, "token", grows=False)
    message = str(error.value)
    assert "2 of the 3 node(s)" in message and "10.0.0.2 (node b)" in message and "10.0.0.3 (node c)" in message
    assert "cannot see" in message and "s3://" in message and "/data/results on every node" in message
    check_storage("/data/results", {"10.0.0.1 (node a)": view("token")}, "token", grows=True)
    assert "nodes the autoscaler adds must see it too" in library_log[0]


def files(nbytes: int, role: str = "data") -> staging.Files:
    return staging.Files(role, "/data/images", ("train/a/0.png",), (nbytes,), "k")


def test_inputs_go_to_the_nodes_that_lack_them_unless_too_large(library_log):
    small, huge = files(10), files(staging.LIMIT_BYTES + 1)
    everywhere = {"a": view(None, True, True), "b": view(None, True, True)}
    assert to_stage([small, huge], everywhere, grows=False) == []
    assert to_stage([small, huge], everywhere, grows=True) == [small]  # later nodes
    assert "nodes the autoscaler adds must have it at /data/images" in library_log[0]
    missing = {"a": view(None, True, False), "b": view(None, False, False)}
    assert to_stage([small], missing, grows=False) == [small]
    with pytest.raises(UserError, match=r"is not on node\(s\) a, b and is larger than the 4 GiB .* on every node"):
        to_stage([small, huge], missing, grows=False)


def test_a_probe_runs_on_every_node_and_reads_the_marker(ray_local, tmp_path):
    marker = tmp_path / ".vitplast-shared-x"
    marker.write_text("token")
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "0.png").write_bytes(b"12345")
    there = staging.Files("data", str(tmp_path), ("train/0.png",), (5,), "k")
    elsewhere = staging.Files("data", str(tmp_path / "nowhere"), ("train/0.png",), (5,), "k")
    views = on_every_node(alive_nodes(), sees, marker=str(marker), inputs=[there, elsewhere])
    assert list(views.values()) == [{"marker": "token", "inputs": [True, False]}]
    blind = on_every_node(alive_nodes(), sees, marker=str(tmp_path / "none"), inputs=[])
    assert list(blind.values()) == [{"marker": None, "inputs": []}]
