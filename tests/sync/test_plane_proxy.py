"""``syncd.sync.proxy``'s proxy choice, table-driven (pure: the environment is a dict). The
requests themselves, through a real proxy, are in tests/syncd/test_proxies.py."""

from __future__ import annotations

import logging

import pytest

from syncd.sync.plane import PlaneClient
from syncd.sync.proxy import bypasses, choose_proxy

P = "http://proxy.corp:3128"


@pytest.mark.parametrize(("no_proxy", "host", "port", "expected"), [
    ("*", "plane.example.com", 443, True),
    ("other.com, *", "plane.example.com", 443, True),
    ("plane.example.com", "plane.example.com", 443, True),
    ("PLANE.Example.COM.", "plane.example.com", 443, True),  # case and a trailing dot
    ("plane.example.com", "Plane.Example.Com.", 443, True),
    ("example.com", "plane.example.com", 443, True),  # a domain of the host
    (".example.com", "plane.example.com", 443, True),
    ("*.example.com", "plane.example.com", 443, True),
    (".example.com", "example.com", 443, True),
    ("example.com", "notexample.com", 443, False),  # a suffix, not a domain
    ("ample.com", "plane.example.com", 443, False),
    ("plane.example.com.evil", "plane.example.com", 443, False),
    ("plane.example.com:443", "plane.example.com", 443, True),
    ("plane.example.com:8443", "plane.example.com", 443, False),
    ("10.1.2.3", "10.1.2.3", 80, True),
    ("10.0.0.0/8", "10.1.2.3", 80, True),
    ("10.0.0.0/8", "11.1.2.3", 80, False),
    ("10.0.0.0/8", "plane.example.com", 80, False),
    ("fd00::/8", "fd00::2", 80, True),
    ("[fd00::2]:8080", "fd00::2", 8080, True),
    ("[fd00::2]:8080", "fd00::2", 80, False),
    ("fd00::2", "fd00::2", 80, True),
    ("", "plane.example.com", 443, False),
    (" , ,", "plane.example.com", 443, False),
    (".", "plane.example.com", 443, False),
])
def test_bypasses(no_proxy: str, host: str, port: int, expected: bool) -> None:
    assert bypasses(no_proxy, host, port) is expected


@pytest.mark.parametrize(("url", "env", "expected"), [
    # by the plane's scheme, as curl and pip choose
    ("https://plane.example.com", {"HTTPS_PROXY": P}, (P, "HTTPS_PROXY")),
    ("https://plane.example.com", {"HTTP_PROXY": P}, None),
    ("http://plane.example.com", {"HTTP_PROXY": P, "HTTPS_PROXY": "http://other:1"},
     (P, "HTTP_PROXY")),
    # lowercase first; an empty value is unset
    ("https://plane.example.com", {"https_proxy": P, "HTTPS_PROXY": "http://other:1"},
     (P, "https_proxy")),
    ("https://plane.example.com", {"https_proxy": " ", "HTTPS_PROXY": P}, (P, "HTTPS_PROXY")),
    # ALL_PROXY last
    ("https://plane.example.com", {"ALL_PROXY": P}, (P, "ALL_PROXY")),
    ("https://plane.example.com", {"all_proxy": "http://other:1", "HTTPS_PROXY": P},
     (P, "HTTPS_PROXY")),
    # no scheme: http://; https:// proxies are supported when named
    ("https://plane.example.com", {"HTTPS_PROXY": "proxy.corp:3128"}, (P, "HTTPS_PROXY")),
    ("https://plane.example.com", {"HTTPS_PROXY": "https://proxy.corp:8443/"},
     ("https://proxy.corp:8443", "HTTPS_PROXY")),
    # no_proxy, either case, lowercase first
    ("https://plane.example.com", {"HTTPS_PROXY": P, "NO_PROXY": ".example.com"}, None),
    ("https://plane.example.com", {"HTTPS_PROXY": P, "no_proxy": "other", "NO_PROXY": "*"},
     (P, "HTTPS_PROXY")),
    # a loopback plane is on this machine: never through a proxy of the environment
    ("http://127.0.0.1:8787", {"HTTP_PROXY": P}, None),
    ("http://127.9.9.9:8787", {"ALL_PROXY": P}, None),
    ("http://localhost:8787", {"http_proxy": P}, None),
    ("http://[::1]:8787", {"http_proxy": P}, None),
    ("http://plane.example.com", {}, None),
])
def test_the_environment_chooses_the_proxy(url: str, env: dict[str, str],
                                           expected: tuple[str, str] | None) -> None:
    proxy = choose_proxy(url, None, env)
    assert (None if proxy is None else (str(proxy.url), proxy.source)) == expected


@pytest.mark.parametrize("url", ["http://127.0.0.1:8787", "https://plane.example.com"])
def test_the_option_wins_over_everything_in_the_environment(url: str) -> None:
    env = {"HTTPS_PROXY": "http://other:1", "HTTP_PROXY": "http://other:1", "NO_PROXY": "*"}
    proxy = choose_proxy(url, P, env)
    assert proxy is not None and (str(proxy.url), proxy.source) == (P, "control_plane.proxy")


def test_credentials_leave_the_url_for_the_proxy_authorization_header() -> None:
    proxy = choose_proxy("https://plane.example.com", None,
                         {"HTTPS_PROXY": "http://ada:s3cr%3Aet@proxy.corp:3128"})
    assert proxy is not None and str(proxy.url) == P
    assert proxy.authorization == "Basic YWRhOnMzY3I6ZXQ="  # base64 of ada:s3cr:et
    assert "s3cr" not in repr(proxy)


@pytest.mark.parametrize("value", ["socks5://proxy.corp:1080", "http://proxy_corp:3128",
                                   "http://ada:s3cret@proxy.corp:3128/path"])
def test_an_unusable_proxy_variable_is_ignored_with_a_warning(
        value: str, caplog: pytest.LogCaptureFixture) -> None:
    """As aiohttp and pip ignore one; the warning names the variable, never its value."""
    with caplog.at_level(logging.WARNING, logger="syncd.sync"):
        assert choose_proxy("https://plane.example.com", None, {"https_proxy": value}) is None
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "ignoring https_proxy for the control plane"]
    assert "s3cret" not in caplog.text and "proxy.corp" not in caplog.text


def test_the_client_reads_this_process_environment_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", P)
    for name in ("https_proxy", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    proxy = PlaneClient("https://plane.example.com", None).proxy
    assert proxy is not None and str(proxy.url) == P
    assert PlaneClient("https://plane.example.com", None, env={}).proxy is None
