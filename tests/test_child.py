"""Calls in a child process: one short-lived process per call, or one for every call of a session (the dry run's
checks and timed steps import torch once); a UserError there is raised here, a crash is a RuntimeError."""

import os
import sys

import pytest

from vitplast_tune.errors import UserError
from vitplast_tune.subprocess_call import call_in_child, session


def test_each_call_runs_in_a_process_of_its_own_outside_a_session():
    first, second = call_in_child("os:getpid"), call_in_child("os:getpid")
    assert os.getpid() not in (first, second) and first != second


def test_the_calls_of_a_session_share_one_process_which_keeps_its_imports():
    with session():
        pid = call_in_child("os:getpid")
        assert call_in_child("os:getpid") == pid
        assert "wave" not in sys.modules  # a module nothing here imports
        call_in_child("builtins:exec", "import wave")
        assert call_in_child("builtins:eval", "'wave' in __import__('sys').modules") is True  # still there
        with pytest.raises(UserError, match="bad input"):
            call_in_child("builtins:exec", "from vitplast_tune.errors import UserError; raise UserError('bad input')")
        assert call_in_child("os:getpid") == pid  # a UserError does not end the session's process
    assert call_in_child("os:getpid") != pid


def test_a_crash_in_a_sessions_process_is_a_runtime_error():
    with session(), pytest.raises(RuntimeError, match="exit 3"):
        call_in_child("os:_exit", 3)
