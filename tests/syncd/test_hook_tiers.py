"""The prompt hook and `syncd recall` against a real daemon (a subprocess): the hook injects the
confident tier only, so a prompt no memory answers injects nothing, and explicit recall says
when it returns memories it is not sure of."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from local_store import ranking
from syncd.hook import FALLBACK_HEADING, named_project, session_heading
from tests.syncd.processes import finish, wait_ready
from tests.syncd.test_daemon import cli, start


async def test_the_hook_injects_only_what_answers_the_prompt(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")  # found through its state file
    await wait_ready(proc)
    try:
        code, out, err = await cli(data, "save", "the billing deploy runs make release-billing "
                                   "from the zq7-ops box")
        assert code == 0 and out.startswith("saved "), err

        def hook_input(prompt: str) -> bytes:
            return json.dumps({"prompt": prompt, "cwd": str(tmp_path)}).encode()

        code, out, err = await cli(data, "recall", "--hook",
                                   stdin=hook_input("how do I run make release-billing on zq7-ops?"))
        assert code == 0, err
        context = json.loads(out)["hookSpecificOutput"]["additionalContext"]
        assert context.startswith("Relevant memories:\n") and "zq7-ops box" in context
        for prompt in ("continue", "thanks, that works now"):
            code, out, err = await cli(data, "recall", "--hook", stdin=hook_input(prompt))
            assert (code, out) == (0, ""), (prompt, out, err)
        # Asked, the daemon answers with what passes the relevance floor — here a memory that
        # holds half the words — and says it is not sure of it.
        partial = "what is for lunch at the zq7-ops office today, and is it vegan?"
        code, out, err = await cli(data, "recall", "--hook", stdin=hook_input(partial))
        assert (code, out) == (0, ""), (out, err)
        code, out, err = await cli(data, "recall", partial)
        assert code == 0 and "zq7-ops box" in out, (out, err)
        assert "no memory surely answers" in err and out.startswith(
            "No memory matched the query with confidence."), (out, err)
        code, out, err = await cli(data, "recall", "--json", partial)
        answer = json.loads(out)
        assert answer["matched"] is False and not answer["memories"][0]["confident"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_a_session_starts_with_the_projects_memories(tmp_path: Path) -> None:
    """``SessionStart`` (startup, resume, clear, compact): the project's memories, the ones
    naming it first; when none matches, the most important recent ones — never an empty
    slate; silent when the daemon is down."""
    data, project = tmp_path / "data", tmp_path / "work" / "payments"

    def session(source: str) -> bytes:
        return json.dumps({"hook_event_name": "SessionStart", "source": source,
                           "cwd": str(project), "session_id": "s1"}).encode()

    code, out, err = await cli(data, "recall", "--hook", stdin=session("startup"))
    assert (code, out) == (0, ""), err  # no daemon: nothing, exit 0
    proc = await start(data, "--listen", "127.0.0.1:0")  # found through its state file
    await wait_ready(proc)
    try:
        code, out, err = await cli(data, "save", "the standup is at ten", "--realm", "team",
                                   "--importance", "0.9")
        assert code == 0, err
        code, out, err = await cli(data, "recall", "--hook", stdin=session("startup"))
        assert (code, out) == (0, ""), err  # another realm's memory is not this project's
        code, out, err = await cli(data, "save", "refunds over 500 EUR need a second approver",
                                   "--realm", "payments", "--importance", "0.9")
        assert code == 0, err
        for source in ("startup", "resume", "clear", "compact"):
            code, out, err = await cli(data, "recall", "--hook", stdin=session(source))
            assert code == 0, err
            output = json.loads(out)["hookSpecificOutput"]
            assert output["hookEventName"] == "SessionStart"
            assert "second approver" in output["additionalContext"]
            assert "standup" not in output["additionalContext"]
        for i in range(40):  # more than the budget holds
            code, _, err = await cli(data, "save", f"payments note {i}: " + "word " * 60,
                                     "--realm", "payments")
            assert code == 0, err
        code, out, err = await cli(data, "recall", "--hook", stdin=session("startup"))
        context = json.loads(out)["hookSpecificOutput"]["additionalContext"]
        assert len(context) <= 4000 and context.endswith("\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


async def test_a_session_with_no_memory_naming_its_project_says_so(tmp_path: Path) -> None:
    """The daemon's fallback heading speaks of a query; a session starts without one."""
    data = tmp_path / "data"
    proc = await start(data, "--listen", "127.0.0.1:0")
    await wait_ready(proc)
    try:
        code, _, err = await cli(data, "save", "deploys go out with make release")
        assert code == 0, err
        hook_input = json.dumps({"hook_event_name": "SessionStart", "source": "startup",
                                 "cwd": str(tmp_path / "proj"), "session_id": "s1"}).encode()
        code, out, err = await cli(data, "recall", "--hook", stdin=hook_input)
        assert code == 0, err
        context = json.loads(out)["hookSpecificOutput"]["additionalContext"]
        assert context == ("No memory names this project (proj) yet. The most important "
                           "recent memories:\n" + context.split("\n", 1)[1]), context
        assert "make release" in context
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0


def test_the_hook_knows_the_daemons_fallback_heading() -> None:
    assert FALLBACK_HEADING == ranking.FALLBACK_HEADING  # the hook cannot import ranking
    assert session_heading("Relevant memories:\n- x\n", "p") == "Relevant memories:\n- x\n"
    assert session_heading(FALLBACK_HEADING + "- x\n", "") == (
        "No memory names this project yet. The most important recent memories:\n- x\n")


def test_a_pointer_at_the_project_is_replaced_by_its_name() -> None:
    assert named_project("how do we deploy this project?", "proj") == "how do we deploy proj?"
    assert named_project("Does our repo pin numpy? And the codebase, this app?", "acme") == \
        "Does acme pin numpy? And acme, acme?"
    assert named_project("the project settings in this   code base", "p") == "p settings in p"
    # Only pointers: a word that merely contains one, or another project's name, stays.
    assert named_project("projects in the repository-list of the billing project", "p") == \
        "projects in the repository-list of the billing project"
    assert named_project("how do we deploy this project?", "") == "how do we deploy this project?"


async def test_a_prompt_about_this_project_recalls_the_projects_memory(tmp_path: Path) -> None:
    """Memories name their project; a prompt says "this project". The hook asks with the
    project's (the cwd's) name, so the memory answers with confidence in its project and the
    same prompt elsewhere injects nothing."""
    data, project, elsewhere = tmp_path / "data", tmp_path / "work" / "proj", tmp_path / "misc"
    proc = await start(data, "--listen", "127.0.0.1:0")  # found through its state file
    await wait_ready(proc)
    try:
        code, out, err = await cli(data, "save", "Deploy proj with 'make ship' from the repo "
                                   "root; it needs AWS_PROFILE=prod", "--realm", "proj")
        assert code == 0, err

        def hook_input(cwd: Path) -> bytes:
            return json.dumps({"prompt": "how do we deploy this project?",
                               "cwd": str(cwd)}).encode()

        code, out, err = await cli(data, "recall", "--hook", stdin=hook_input(project))
        assert code == 0, err
        assert "make ship" in json.loads(out)["hookSpecificOutput"]["additionalContext"]
        code, out, err = await cli(data, "recall", "--hook", stdin=hook_input(elsewhere))
        assert (code, out) == (0, ""), (out, err)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert (await finish(proc))[0] == 0
