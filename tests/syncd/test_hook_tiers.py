"""The prompt hook and `syncd recall` against a real daemon (a subprocess): the hook injects the
confident tier only, so a prompt no memory answers injects nothing, and explicit recall says
when it returns memories it is not sure of."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.syncd.processes import finish, wait_ready
from tests.syncd.test_daemon import cli, start


async def test_the_hook_injects_only_what_answers_the_prompt(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = await start(data)
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
    proc = await start(data)
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
