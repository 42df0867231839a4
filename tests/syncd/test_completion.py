"""``syncd completion bash|zsh|fish`` (issue 35): each script, loaded into the real shell,
completes commands, nested commands, options and option values as the CLI takes them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.syncd.processes import cli

# (typed line, what completing its last word offers)
BASH_CASES = [
    ("syncd re", ["recall", "restore"]),
    ("syncd hub ", ["token", "key", "invite"]),
    ("syncd hub token ", ["create", "list", "revoke"]),
    ("syncd --data-dir /tmp hub t", ["token"]),  # a valued global option's value is skipped
    ("syncd setup ", ["claude-code", "mcp"]),
    ("syncd setup claude-code --d", ["--data-dir", "--dry-run"]),
    ("syncd export --format ", ["json", "markdown"]),
    ("syncd hub --cursor o", ["origin"]),
    ("syncd service ", ["install", "uninstall", "status"]),
    ("syncd completion ", ["bash", "zsh", "fish"]),
    ("syncd recall --realm x --t", ["--tag", "--type"]),
]


def shell(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (.ci/run installs it)")
    return found


async def script_for(tmp_path: Path, name: str) -> Path:
    code, out, err = await cli(tmp_path, "completion", name)
    assert code == 0, err
    path = tmp_path / f"syncd.{name}"
    path.write_text(out)
    return path


def bash_complete(bash: str, script: Path, line: str, ksharrays: bool = False) -> list[str]:
    """Run the completion function as the shell would for ``line`` (cursor at its end)."""
    words = line.split(" ")
    array = " ".join(f"'{w}'" for w in words)
    setup = "setopt ksharrays; " if ksharrays else ""
    program = (f"source {script}; {setup}COMP_WORDS=({array}); "
               f"COMP_CWORD={len(words) - 1}; COMPREPLY=(); _syncd; "
               'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run([bash, "-c", program], capture_output=True, text=True, timeout=60,
                          cwd=script.parent)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return [w for w in done.stdout.splitlines() if w]


async def test_bash_completes_commands_options_and_values(tmp_path: Path) -> None:
    script = await script_for(tmp_path, "bash")
    for line, offered in BASH_CASES:
        assert sorted(bash_complete(shell("bash"), script, line)) == sorted(offered), line
    (tmp_path / "memories.json").write_text("{}")
    assert bash_complete(shell("bash"), script, "syncd import memor") == ["memories.json"]
    everything = bash_complete(shell("bash"), script, "syncd ")
    assert {"run", "status", "list", "get", "delete", "stop", "recall", "save", "export",
            "import", "sync", "hub", "setup", "completion"} <= set(everything), everything


async def test_zsh_loads_the_script_and_completes_through_bashcompinit(tmp_path: Path) -> None:
    script = await script_for(tmp_path, "zsh")
    assert script.read_text().startswith("#compdef syncd\n")
    # zsh's own completion system filters what is offered by the typed prefix; these lines
    # end in an empty word, so what the function offers is the whole answer.
    for line, offered in BASH_CASES:
        if line.endswith(" "):
            got = bash_complete(shell("zsh"), script, line, ksharrays=True)
            assert sorted(got) == sorted(offered), line


async def test_fish_completes_commands_options_and_values(tmp_path: Path) -> None:
    script = await script_for(tmp_path, "fish")

    def complete(line: str) -> list[str]:
        done = subprocess.run([shell("fish"), "-c", f"source {script}; complete -C '{line}'"],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 0 and done.stderr == "", done.stderr
        return sorted(row.split("\t")[0] for row in done.stdout.splitlines())

    assert complete("syncd hub ") == ["invite", "key", "token"]
    assert complete("syncd hub token ") == ["create", "list", "revoke"]
    assert complete("syncd export --format ") == ["json", "markdown"]
    assert complete("syncd rec") == ["recall"]
    assert "--tag" in complete("syncd recall --t") and "--type" in complete("syncd recall --t")
    assert complete("syncd completion ") == ["bash", "fish", "zsh"]
