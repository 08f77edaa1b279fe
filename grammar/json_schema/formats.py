"""String `format`s as patterns: exact, or narrower than every validator we know of.

Each format is an ECMA-style pattern (ASCII only, anchored by `format_regex`), so it goes
through the same translator as `pattern`. Narrowings, all deliberate:

* date, date-time: real calendar dates (leap years included), years 0001-9999; ``T`` and
  ``Z`` upper case; no leap second (``:60``).
* time, date-time: an offset is required (RFC 3339 ``full-time``).
* email: dot-atom local part at a host name (no quoted local parts, no IP literals).
* hostname: 1 to 4 labels of at most 62 characters (so at most 251 characters).
* uri: ``scheme://authority path ?query #fragment`` with a registered-name or IPv4 host and
  a port <= 65535, ``file:///path``, or an opaque ``scheme:path`` for ``urn``/``mailto``/
  ``tel`` and schemes with a digit or ``+.-`` (never special URL schemes like ``http``).
* ipv6: RFC 4291 text forms without zone index.
* uri-template: RFC 6570 up to level 4 with ASCII literals (no ``ucschar``/``iprivate``
  characters outside expressions).

Formats that JSON Schema defines but this module lacks (``regex``, ``iri``, ``uri-reference``
...) are refused; formats JSON Schema does not define are annotations and are ignored.
"""

from __future__ import annotations

_YEAR = "(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = (
    "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_HOUR = "(?:[01][0-9]|2[0-3])"
_MINUTE = "[0-5][0-9]"
TIME = f"{_HOUR}:{_MINUTE}:{_MINUTE}(?:\\.[0-9]+)?(?:Z|[+-]{_HOUR}:{_MINUTE})"
DATE_TIME = f"{DATE}T{TIME}"

_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4 = f"(?:{_OCTET}\\.){{3}}{_OCTET}"


def _ipv6() -> str:
    h16 = "[0-9A-Fa-f]{1,4}"
    ls32 = f"(?:{h16}:{h16}|{IPV4})"
    forms = [f"(?:{h16}:){{6}}{ls32}", f"::(?:{h16}:){{5}}{ls32}"]
    for before, after in ((0, 4), (1, 3), (2, 2), (3, 1)):
        head = f"(?:(?:{h16}:){{0,{before}}}{h16})?" if before else f"(?:{h16})?"
        forms.append(f"{head}::(?:{h16}:){{{after}}}{ls32}")
    forms.append(f"(?:(?:{h16}:){{0,4}}{h16})?::{ls32}")
    forms.append(f"(?:(?:{h16}:){{0,5}}{h16})?::{h16}")
    forms.append(f"(?:(?:{h16}:){{0,6}}{h16})?::")
    return "(?:" + "|".join(forms) + ")"


IPV6 = _ipv6()
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?"
HOSTNAME = f"{_LABEL}(?:\\.{_LABEL}){{0,3}}"
_ATOM = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_DOMAIN_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
EMAIL = f"{_ATOM}(?:\\.{_ATOM})*@{_DOMAIN_LABEL}(?:\\.{_DOMAIN_LABEL}){{1,3}}"
UUID = "[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"

_PCT = "%[0-9A-Fa-f]{2}"
_PCHAR = f"(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|{_PCT})"
_URI_HOST = f"(?:{IPV4}|(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\\.)*[A-Za-z](?:[A-Za-z0-9-]*[A-Za-z0-9])?)"
_PORT = "(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_USERINFO = f"(?:(?:[A-Za-z0-9._~!$&'()*+,;=:-]|{_PCT})*@)?"
_QUERY_FRAGMENT = f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
# Without "//", a URL parser treats special schemes (http, file, ...) as if the host
# followed: the opaque form is only admitted for schemes that cannot be special.
_OPAQUE_SCHEME = "(?:[uU][rR][nN]|[mM][aA][iI][lL][tT][oO]|[tT][eE][lL]|[A-Za-z][A-Za-z]*[0-9+.-][A-Za-z0-9+.-]*)"
URI = (
    f"(?:[A-Za-z][A-Za-z0-9+.-]*://{_USERINFO}{_URI_HOST}(?::{_PORT})?(?:/{_PCHAR}*)*"
    f"|[fF][iI][lL][eE]://(?:/{_PCHAR}*)+"
    f"|{_OPAQUE_SCHEME}:[A-Za-z0-9._~!$&'()*+,;=-]{_PCHAR}*(?:/{_PCHAR}*)*)"
    f"{_QUERY_FRAGMENT}"
)
_JSON_POINTER = "(?:/(?:[^/~]|~[01])*)*"
_DURATION_TIME = "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
DURATION = (
    f"P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:{_DURATION_TIME})?"
    f"|{_DURATION_TIME}|[0-9]+W)"
)

_TEMPLATE_LITERAL = f"(?:[!#$&()*+,\\-./0-9:;=?@A-Z\\[\\]_a-z~]|{_PCT})"
_VARCHAR = f"(?:[A-Za-z0-9_]|{_PCT})"
_VARSPEC = f"{_VARCHAR}(?:\\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\\*)?"
URI_TEMPLATE = f"(?:{_TEMPLATE_LITERAL}|\\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*"

FORMATS: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "hostname": HOSTNAME,
    "email": EMAIL,
    "uuid": UUID,
    "uri": URI,
    "uri-template": URI_TEMPLATE,
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": f"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})",
    "duration": DURATION,
}
# Defined by JSON Schema (any draft) but not supported here: refused, never ignored.
UNSUPPORTED_FORMATS = frozenset(
    {
        "regex",
        "iri",
        "iri-reference",
        "uri-reference",
        "idn-email",
        "idn-hostname",
        "color",
        "host-name",
        "ip-address",
        "utc-millisec",
        "style",
        "phone",
    }
)


def format_pattern(name: str) -> str | None:
    """The anchored ECMA pattern for a supported format, None for a non-standard one.
    Raises KeyError for a standard format this module does not support."""
    if name in FORMATS:
        return "^" + FORMATS[name] + "$"
    if name in UNSUPPORTED_FORMATS:
        raise KeyError(name)
    return None
