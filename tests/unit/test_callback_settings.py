"""The status callbacks' settings: on only with a secret and an http(s) URL, the secret and
the URL's password masked wherever settings are shown, and a URL the HTTP client could not
send to refused at start, saying which rule it breaks without showing its password."""

from __future__ import annotations

import json

import pytest

from app.errors import SettingsError
from app.logs import secret_values
from tests.unit.callback_world import SECRET, callback_settings


def test_callbacks_need_a_secret_and_an_http_url(tmp_path, job_root):
    with pytest.raises(SettingsError, match="CALLBACK_SECRET"):
        callback_settings(tmp_path, job_root, CALLBACK_SECRET="")
    with pytest.raises(SettingsError, match="CALLBACK_SECRET"):
        callback_settings(tmp_path, job_root, CALLBACK_SECRET="short")
    with pytest.raises(SettingsError, match="CALLBACK_URL"):
        callback_settings(tmp_path, job_root, CALLBACK_URL="ftp://flip-api/cb")
    off = callback_settings(tmp_path, job_root, CALLBACK_URL="  ", CALLBACK_SECRET="")
    assert not off.callbacks_enabled


def test_the_secret_and_url_password_are_masked(tmp_path, job_root):
    settings = callback_settings(
        tmp_path, job_root, CALLBACK_URL="https://flip:pw-in-url@flip-api/cb"
    )
    shown = json.dumps(settings.redacted())
    assert SECRET not in shown and "pw-in-url" not in shown
    assert {SECRET, "pw-in-url"} <= set(secret_values(settings))


@pytest.mark.parametrize(
    "url",
    [
        "http://u:pw-in-url@127.0.0.1:abc/x",  # a port that is not a number
        "http://[::1/cb",  # an unclosed IPv6 host
        "https://flip-api:70000/cb",  # a port out of range: unreachable for ever
        "http://pw-in-url@/cb",  # no host at all: likewise
    ],
)
def test_a_callback_url_the_client_cannot_use_is_refused_at_start(tmp_path, job_root, url):
    """Accepted, the first two failed every delivery round with the client's invalid-URL
    error (an exception, not a back-off), the others never reached anything; the message
    names the rule, not the value."""
    with pytest.raises(SettingsError, match="CALLBACK_URL") as refused:
        callback_settings(tmp_path, job_root, CALLBACK_URL=url)
    assert "pw-in-url" not in str(refused.value)


def test_a_callback_url_with_an_uppercase_scheme_is_accepted(tmp_path, job_root):
    # A scheme is case-insensitive (RFC 3986), and the client sends to it as https.
    url = "HTTPS://flip-api/cb"
    assert callback_settings(tmp_path, job_root, CALLBACK_URL=url).callback_url == url


def test_a_callback_url_with_a_port_and_credentials_is_accepted(tmp_path, job_root):
    url = "https://flip:pw@flip-api.internal:8443/callbacks?x=1"
    assert callback_settings(tmp_path, job_root, CALLBACK_URL=f" {url} ").callback_url == url


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1]x/cb",  # text after the IPv6 host's bracket
        "http://[::1]]/cb",  # a stray bracket
        "http://[v1.x]/cb",  # an IPvFuture host the client does not take
        "http://256.1.1.1/cb",  # an IPv4 address out of range
        "http://flip\tapi/cb",  # a control character inside
        "http://flip-api/cb\x7f",
        "http://xn--/cb",  # a punycode label with nothing after its prefix
        "http://flip..api/cb",  # an empty label: the resolver's IDNA codec raises
        "http://" + "a" * 64 + ".example/cb",  # a label longer than 63: likewise
    ],
)
def test_a_callback_url_the_client_parses_but_cannot_send_to_is_refused_at_start(
    tmp_path, job_root, url
):
    """Accepted at start (urlsplit reads a host and no bad port), each made every delivery
    round raise the client's InvalidURL, IDNAError or UnicodeError instead of backing off."""
    with pytest.raises(SettingsError, match="CALLBACK_URL"):
        callback_settings(tmp_path, job_root, CALLBACK_URL=url)


def test_a_raw_at_sign_in_the_callback_urls_password_is_refused(tmp_path, job_root):
    """The client reads the password up to the last '@' (p@ss-in-url), the log filter and
    redact_url up to the first: 'ss-in-url' was left readable in every redacted line."""
    with pytest.raises(SettingsError, match="%40") as refused:
        callback_settings(tmp_path, job_root, CALLBACK_URL="http://u:p@ss-in-url@flip-api/cb")
    assert "ss-in-url" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1]:8080/cb",
        "http://[fe80::1%25eth0]:8080/cb",
        "https://flip:p%40ss@flip-api.internal:8443/cb?x=1",
        "http://flip-api.internal./cb",  # a fully qualified name's trailing dot
        "http://flip-\u00e4pi.example/cb",  # an internationalised name
        "http://u@flip-api/cb",
    ],
)
def test_valid_callback_urls_are_still_accepted(tmp_path, job_root, url):
    assert callback_settings(tmp_path, job_root, CALLBACK_URL=f"{url}  ").callback_url == url
