"""Secret detectors of the secrets stage: detect-secrets' token plugins behind cheap gates, plus our rules
(values assigned to secret names, PEM private-key bodies, passwords in URLs, auth headers)."""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, cast

from detect_secrets.filters.heuristic import is_sequential_string, is_templated_secret
from detect_secrets.plugins.artifactory import ArtifactoryDetector
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.cloudant import CloudantDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.keyword import DENYLIST as DS_SECRET_WORDS
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.softlayer import SoftlayerDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector


class Span(NamedTuple):
    start: int
    end: int
    kind: str
    rank: int  # where spans overlap, the lower rank names the kind (a vendor's format beats "password")


# Ranks: a token format someone documents > a structural rule > a value next to a secret name.
VENDOR, STRUCTURE, NAMED = 0, 1, 2


@dataclass(frozen=True)
class Detector:
    """One pattern and the lowercase literals (triggers) without which it cannot match. The
    pattern runs only on the lines where one of its triggers was found (see TriggerIndex), so a
    text pays one scan for all detectors, not one per pattern."""

    kind: str
    pattern: re.Pattern[str]
    triggers: tuple[str, ...] | None  # None: the pattern starts with a literal and runs on the whole text
    rank: int = VENDOR
    word_start: bool = False  # the match may not continue a word (a leading \b, checked here)

    def spans(self, text: str, windows: Iterable[tuple[int, int]]) -> Iterator[Span]:
        for lo, hi in windows:
            for m in self.pattern.finditer(text, lo, hi):
                span = self._secret(text, m)
                if span is not None:
                    yield span

    def _secret(self, text: str, m: re.Match[str]) -> Span | None:
        start, end = m.span()
        if self.word_start and start and (text[start - 1].isalnum() or text[start - 1] == "_"):
            return None
        # A group that ends the match (give or take a closing quote or `@`) is the secret with its
        # context around it (`://user:(pw)@`, `aws_key = "(...)"`); a group elsewhere is a prefix
        # alternation (`(ghp|gho)_...`), and then the whole match is the secret.
        for g in range(m.re.groups, 0, -1):
            if m.group(g) and m.end(g) >= end - 1:
                start, end = m.span(g)
                break
        while start < end and text[start] in _LEAD:
            start += 1
        while end > start and text[end - 1] in _TRAIL:
            end -= 1
        return Span(start, end, self.kind, self.rank) if end - start >= 4 else None


# Context characters some library patterns match around a token (`(?:\\s|=|:|"|^)AKC...`).
_LEAD = frozenset(" \t\r\n=:\"'`")
_TRAIL = frozenset(" \t\r\n\"'`")


def _kind_of(plugin: type[RegexBasedDetector]) -> str:
    if plugin is BasicAuthDetector:
        return "url_password"  # what our own rule calls the same thing
    return re.sub(r"[^a-z0-9]+", "_", str(plugin.secret_type).lower()).strip("_")


def _hex_after(prefix: str) -> tuple[str, ...]:
    return tuple(prefix + c for c in "0123456789abcdef")


# detect-secrets' regex plugins with the triggers of their patterns (one tuple for all of a
# plugin's patterns, or a list with one per pattern), read off the library's regexes. Left out:
# PrivateKeyDetector (its patterns match only a key's header line: ours below masks the body),
# IPPublicDetector (an address is not a secret, and masking it hurts search), KeywordDetector and
# the entropy plugins (one line at a time, with per-file-type regexes: `named_values` below does
# that job over whole texts, with the library's keyword list). Triggers are chosen among letters
# the scan looks for anyway (each first letter costs a pass over the text). Where a trigger narrows
# a plugin (Discord tokens on a line with "bot", Telegram's near "telegram" or "bot"),
# `named_values` still masks `*_TOKEN = value`.
_DS_TRIGGERS: dict[type[RegexBasedDetector], tuple[str, ...] | list[tuple[str, ...] | None] | None] = {
    AWSKeyDetector: [None, ("aws",)],
    ArtifactoryDetector: [("akc",), _hex_after("ap")],
    AzureStorageKeyDetector: None,
    BasicAuthDetector: ("://",),
    CloudantDetector: ("cloudant", "cl_", "cl-", "clkey", "clpass", "clpw", "clapi", "cltoken", "clou"),
    DiscordBotTokenDetector: ("bot",),
    GitHubTokenDetector: ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    GitLabTokenDetector: ("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "gr1348941", "glcbt-", "glimt-",
                          "glptt-", "glagent-", "gloas-"),
    IbmCloudIamDetector: ("ibm", "iam"),  # its vendor prefix is optional; "key" lines would cost 0.1 s on django
    IbmCosHmacDetector: ("secret_access_key", "secret-access-key", "secretaccesskey", "secret_key",
                         "secret-key", "secretkey"),
    JwtTokenDetector: None,
    MailchimpDetector: tuple(f"-us{d}" for d in range(10)),
    NpmDetector: ("_authtoken",),
    OpenAIDetector: ("t3blbkfj",),
    PypiTokenDetector: ("pypi-",),
    SendGridDetector: ("sg.",),
    SlackDetector: [("xox",), ("://",)],
    SoftlayerDetector: ("softlayer", "sl_", "sl-", "slapi", "slkey", "slpass", "slpwd", "sltoken"),
    SquareOAuthDetector: ("sq0csp-",),
    StripeDetector: ("k_live_",),
    TelegramBotTokenDetector: ("telegram", "bot"),
    TwilioKeyDetector: None,  # `AC...`/`SK...`: lowercased, those letters are everywhere
}


# Library patterns we replace. detect-secrets' JWT pattern ends in a lazy `[...]*?`, which `finditer`
# stops at the second dot: header and payload were masked and the signature left in the text.
_DS_PATTERNS: dict[type[RegexBasedDetector], list[re.Pattern[str]]] = {
    JwtTokenDetector: [re.compile(r"eyJ[A-Za-z0-9_=-]+\.[A-Za-z0-9_=-]+(?:\.[A-Za-z0-9_+/=-]+){0,3}")],
}


def _library_detectors() -> list[Detector]:
    out = []
    for plugin, spec in _DS_TRIGGERS.items():
        # a class attribute, typed as a property
        patterns = _DS_PATTERNS.get(plugin) or list(cast("Iterable[re.Pattern[str]]", plugin.denylist))
        per_pattern = spec if isinstance(spec, list) else [spec] * len(patterns)
        assert len(per_pattern) == len(patterns), f"{plugin.__name__}: one trigger tuple per pattern"
        out += [Detector(_kind_of(plugin), pattern, triggers) for pattern, triggers in zip(patterns, per_pattern, strict=True)]
    return out


LIBRARY_DETECTORS = _library_detectors()

# Token formats their issuers document that the library does not know (or knows only in an older
# form: OpenAI's project keys, GitHub's fine-grained tokens, Stripe test keys).
_PREFIXES: list[tuple[str, str, tuple[str, ...] | None]] = [
    ("github_token", r"(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{22,255})",
     ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
    ("anthropic_key", r"sk-ant-[A-Za-z0-9_-]{20,}", ("sk-ant-",)),
    ("openai_key", r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}", ("sk-",)),
    ("google_api_key", r"AIza[0-9A-Za-z_-]{35}", None),
    ("slack_token", r"xox[abposr]-[A-Za-z0-9-]{10,}", ("xox",)),
    ("stripe_key", r"[spr]k_(?:live|test)_[A-Za-z0-9]{16,}", ("k_live_", "k_test_")),
    ("npm_token", r"npm_[A-Za-z0-9]{36}", None),
    ("huggingface_token", r"hf_[A-Za-z0-9]{30,}", None),
    ("digitalocean_token", r"do[por]_v1_[a-f0-9]{64}", None),
    ("shopify_token", r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}", ("shpat_", "shpss_", "shpca_", "shppa_")),
    ("databricks_token", r"dapi[a-f0-9]{32}(?![A-Za-z0-9])", None),
    ("age_secret_key", r"AGE-SECRET-KEY-1[0-9A-Z]{58}", None),
    ("aws_access_key", r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}(?![0-9A-Za-z])", None),
]

_NL = r"(?:\r?\n|\\r?\\n)"  # a real line break, or an escaped one inside a JSON string
_PEM_NAME = r"(?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?"
RULE_DETECTORS = [
    *(Detector(kind, re.compile(pattern), triggers, word_start=True) for kind, pattern, triggers in _PREFIXES),
    # The body of a private key between its BEGIN and END lines (or the end of a cut text); the
    # two lines stay, so a search for "PRIVATE KEY" still finds where keys were. Many lines long,
    # so it runs on the whole text (its literal start makes that cheap).
    Detector("private_key", re.compile(
        rf"-----BEGIN {_PEM_NAME}-----{_NL}?(?P<body>[\s\S]*?)(?={_NL}?-----END {_PEM_NAME}-----|\Z)"),
        None, rank=STRUCTURE),
    Detector("url_password", re.compile(r"://[^/\s:@\"'<>]+:(?P<pw>[^@\s/\"'<>]{3,})@"), ("://",), rank=STRUCTURE),
    Detector("auth_header", re.compile(
        r"(?i:\b(?:proxy-)?authorization\s*[:=]\s*[\"']?(?:bearer|basic|token|digest)\s+|\bbearer\s+)"
        r"(?P<cred>[A-Za-z0-9._~+/-]{12,}=*)"), ("authoriz", "bearer"), rank=STRUCTURE),
    Detector("basic_auth", re.compile(r"(?:^|\s)(?:-u|--user)\s+[\"']?[^:\s\"'/]+:(?P<pw>[^\s\"']{3,})"),
             ("-u ", "--user"), rank=STRUCTURE),
    # requests' `auth=("user", "password")`: the password is the tuple's second string.
    Detector("basic_auth", re.compile(r"\bauth\s*=\s*\(\s*[\"'][^\"'\n]*[\"']\s*,\s*[\"'](?P<pw>[^\"'\n]{4,})[\"']"),
             ("auth",), rank=STRUCTURE),
    # `.netrc` lines, and registry logins and MySQL's glued `-pPASSWORD` on a command line.
    Detector("password", re.compile(r"machine\s+\S+\s+(?:login\s+\S+\s+)?password\s+(?P<pw>\S+)"),
             ("pass",), rank=STRUCTURE, word_start=True),
    Detector("password", re.compile(r"login\b[^\n]*?\s(?:-p|--password)[ =](?P<pw>[^\s\"'$]\S{3,})"),
             ("-p", "pass"), rank=STRUCTURE, word_start=True),
    Detector("password", re.compile(r"mysql(?:dump|admin)?\b[^\n]*?\s-p(?P<pw>[^\s\"'$-]\S{3,})"),
             ("-p",), rank=STRUCTURE, word_start=True),
    # sshpass takes the password itself after -p: `sshpass -p 'hunter2' ssh host` ($VAR is a reference).
    Detector("password", re.compile(r"sshpass\b[^\n]*?\s-p ?[\"']?(?P<pw>[^\s\"'$]{4,})"),
             ("sshpass",), rank=STRUCTURE, word_start=True),
]


# --- values assigned to secret names ------------------------------------------------------------

# A name is secret when one of its words says so: the library's keyword list (`api_?key`,
# `db_?pass`, `password`, `secret`...) plus token, credential and passphrase forms.
_STRONG = re.compile(
    "|".join([*(f"(?:{w})" for w in DS_SECRET_WORDS),
              r"pass", r"pw", r"passphrase", r"[a-z]*passw(?:or)?d", r"[a-z]*secrets?", r"[a-z]*tokens?",
              r"credentials?", r"access_?key", r"secret_?key", r"api_?token", r"signing_?key",
              r"encryption_?key", r"master_?key", r"bearer"]))
# Words that take a high-entropy value to count: `key`, `salt`, `auth`, `signature`...
_WEAK = re.compile(r"[a-z]*key|auth|salt|hmac|signature")
# A last word that makes the name describe a secret rather than hold one (`password_reset_timeout`,
# `token_type`, `max_tokens`, `PASSWORD_HASHERS`).
_NOT_SECRET_WORDS = (
    "type types name names count counts len length size max min limit limits file files path paths dir url "
    "uri endpoint field fields label prompt hint policy policies class env var vars header headers param "
    "params expiry expires expiration ttl timeout lifetime age kind format pattern regex validator "
    "validators hasher hashers required reset change changed form input strength backend backends "
    "generator mode scheme prefix suffix cache store provider manager model enabled disabled display "
    "placeholder help text message error errors tokens fn func callback handler view views template "
    "widget id ids index length_min length_max column columns attr attribute rule rules regexp "
    "option options flag flags parser lookup storage loader class_name location version source sources "
    "start end missing invalid user username login email account startswith endswith contains icontains "
    "exact iexact isnull")
NOT_SECRET = frozenset(_NOT_SECRET_WORDS.split())
# The words a secret name holds (found with the detectors' triggers, in one scan).
KEYWORDS = ("pass", "pw", "secret", "token", "key", "auth", "credential", "salt", "signature", "contrase")  # pw: pwd too
_NAME_TAIL = re.compile(r"[A-Za-z0-9_.\-]*")
_NAME_HEAD = re.compile(r"[A-Za-z0-9_.\-]+\Z")
_ASSIGN = re.compile(
    r"""\\?["'`]?\]?(?:[ \t]*(?P<op>:=|=>|===?|=)|:(?![:/]))[ \t]*"""
    r"""(?:\\?"(?P<dq>[^"\r\n]*?)\\?"|'(?P<sq>[^'\r\n]*)'|`(?P<bq>[^`\r\n]*)`|(?P<bare>[^\s"'`,;(){}\[\]<>&|]+))""")
_FLAG_VALUE = re.compile(r"""[ \t]+(?:"(?P<dq>[^"\r\n]*)"|'(?P<sq>[^'\r\n]*)'|(?P<bare>[^\s"'`;&|]+))""")
_XML_VALUE = re.compile(r">(?P<bare>[^<\r\n]{4,})</")
# "the password is X", "the password was: X", "the password for the admin account: X".
_PROSE_VALUE = re.compile(r"""[ \t]+(?:is|was|(?:for|of|on)[ \t]+[\w@.'-]+(?:[ \t]+[\w@.'-]+){0,3}[ \t]*(?=:|[ \t]+is\b)(?:[ \t]+is)?)"""
                          r"""[ \t]*:?[ \t]+["'`]?(?P<bare>[^\s"'`,;]+?)["'`]?(?=[\s,;.]*(?:\s|$))""")
_PW_WORD = re.compile(r"(?<![a-z])pwd?(?![a-z])")  # `pw`, `db_pwd`, `PW`: a password's name, not `upwork`
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_SPLIT = re.compile(r"[._\-$@]+")
_PLACEHOLDER_WORDS = ("none null nil true false yes no on off undefined string str bytes int bool required "
                      "optional secret password changeme example redacted xxx read write")
PLACEHOLDERS = frozenset(_PLACEHOLDER_WORDS.split())


@functools.lru_cache(maxsize=4096)
def name_strength(name: str) -> int:
    """2: the name announces a secret; 1: a secret if its value looks random; 0: not secret."""
    words = [w for w in _SPLIT.split(_CAMEL.sub(r"\1_\2", name).lower()) if w]
    if not words:
        return 0
    if words[-1] in NOT_SECRET:
        return 0
    if any(_STRONG.fullmatch(w) for w in words) or any(
            _STRONG.fullmatch(f"{a}_{b}") or _STRONG.fullmatch(a + b) for a, b in itertools.pairwise(words)):
        return 2
    if any(_WEAK.fullmatch(w) for w in words):
        return 1
    return 0


def entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values()) if n else 0.0


def looks_random(value: str) -> bool:
    """Long enough, mixed enough and varied enough to be a generated key rather than a word."""
    # A digit too: 20 random base64 characters hold none 3% of the time, and the words of
    # camel-cased identifiers (`NSHorizontalPagination`) hold none at all.
    if len(value) < 16 or not any(c.isdigit() for c in value) or any(c.isspace() for c in value):
        return False
    return (any(c.islower() for c in value) or any(c.isupper() for c in value)) and entropy(value) >= 3.3


def plausible_value(value: str, name: str, strength: int, quoted: bool, code: bool, next_char: str) -> bool:
    """Whether a value assigned to a secret-ish name is a literal secret rather than code, a type,
    a placeholder, a template or a label."""
    if len(value) < 4 or value.startswith("[REDACTED"):
        return False
    if is_templated_secret(value) or value[0] in "$%" or "{{" in value or "${" in value or "%(" in value:
        return False
    lowered = value.lower()
    if lowered in PLACEHOLDERS or not value.strip("*xX.-_#<>?! ") or value.endswith("..."):
        return False  # `token=****`, `token: "content..."`
    bare_value, bare_name = _ALNUM.sub("", lowered), _ALNUM.sub("", name.lower())
    if bare_value and (bare_name.endswith(bare_value) or bare_value.endswith(bare_name)):
        return False  # `token=token`, `'X-CSRFToken': csrftoken`, `password=$password`
    if (value.isdigit() and len(value) < 6) or is_sequential_string(value):
        return False
    if value.startswith(("http://", "https://", "/", "./", "~/")) and not looks_random(value):
        return False  # an address or a path; a password inside a URL is the url_password rule's
    if next_char and next_char in "([" and not quoted:
        return False  # `password = form.cleaned_data[...]`, `key = f(...)`
    if code and not quoted and _IDENTIFIER.fullmatch(value):
        return False  # `key = AWSS3Storage.prefix`: an expression, however random its letters
    # In source code a secret is a string literal: a bare value is an expression
    # (`token = next_token`), and a literal with spaces or made of snake/kebab words is a
    # message or a key's name (`REASON = "CSRF token missing."`, `SESSION_KEY = "_auth_user_id"`).
    if code and (not quoted or any(c.isspace() for c in value) or _WORDS_ID.fullmatch(value)):
        return looks_random(value)
    return strength == 2 or looks_random(value)


_WORDS_ID = re.compile(r"_?[a-z]+(?:[_-][a-z]+)+")
_ALNUM = re.compile(r"[^a-z0-9]")


def named_values(text: str, hits: Iterable[tuple[int, int]], code: bool) -> Iterator[Span]:
    """Values assigned to secret names: `KEY=value`, `key: value`, `"key": "value"`, `--key value`,
    `<key>value</key>`, wherever they stand (a grep line `path:3:KEY=value`, a sentence).
    `hits` are the (start, end) of KEYWORDS in the text, in order."""
    last_end = -1
    for hit_start, hit_end in hits:
        if hit_start < last_end:
            continue  # inside a name already looked at
        # Most hits (`key` in `keys()`, `dict[key]`) have no assignment after their name: that
        # test comes first, and the name is found backwards only for the few that do.
        end = _NAME_TAIL.match(text, hit_end).end()  # type: ignore[union-attr]  # matches empty
        last_end = end
        m = _ASSIGN.match(text, end)
        after = text[end:end + 1]
        if m is None and after not in (" ", "\t", ">"):
            continue
        head = _NAME_HEAD.search(text, max(0, hit_start - 80), hit_start)
        start = head.start() if head else hit_start
        if start and text[start - 1] == "=":
            continue  # `input[type=password]`: the word is a value here, not a name
        name = text[start:end]
        if m is None and after != ">" and name.startswith("-"):
            m = _FLAG_VALUE.match(text, end)  # `--password hunter2`
        if m is None and after == ">" and start > 0 and text[start - 1] == "<":
            m = _XML_VALUE.match(text, end)  # `<password>hunter2</password>`
        if m is None and after != ">" and not code:
            # "my password is hunter2": only a value with a digit, so "the token is expired" stays.
            m = _PROSE_VALUE.match(text, end)
            if m is not None and (len(m.group("bare")) < 6 or not any(c.isdigit() for c in m.group("bare"))):
                m = None
        if m is None:
            continue
        # `token.contents = ...` names an attribute of a token: the last dotted part decides.
        key = name.strip("-.").rsplit(".", 1)[-1]
        strength = name_strength(key)
        if not strength:
            continue
        groups = m.groupdict()
        if code and (groups.get("op") or "").startswith("=="):
            continue  # `if token == "COLLATE"` compares a parser's token, not a secret
        for group in ("dq", "sq", "bq", "bare"):
            value = groups.get(group)
            if value is not None:
                v_start, v_end = m.span(group)
                quoted = group != "bare"
                break
        else:
            continue
        if plausible_value(value, key, strength, quoted, code, text[v_end:v_end + 1]):
            last_end = v_end
            lowered_name = name.lower()
            yield Span(v_start, v_end, "password" if "pass" in lowered_name or _PW_WORD.search(lowered_name)
                       else "secret", NAMED)


# Every `NAME=value` / `name: value` of a file that is a secret by its name (opted into the
# index): its values are masked whatever the names say, except booleans, numbers and blanks.
_ANY_ASSIGN = re.compile(r"""^[ \t]*(?:export[ \t]+|-[ \t]+)?["']?[\w.-]+["']?[ \t]*[=:][ \t]*["']?(?P<v>[^\s"'#][^\r\n"']*?)["']?[ \t]*$""",
                         re.MULTILINE)


def file_values(text: str) -> Iterator[Span]:
    for m in _ANY_ASSIGN.finditer(text):
        value = m.group("v")
        if value.lower() in PLACEHOLDERS or re.fullmatch(r"[\d.]+", value) or value.startswith("[REDACTED"):
            continue
        yield Span(m.start("v"), m.end("v"), "value", NAMED)


# --- one scan for every detector's triggers ----------------------------------------------------

DETECTORS = [*LIBRARY_DETECTORS, *RULE_DETECTORS]

Scan = tuple[re.Pattern[str], str, dict[str, tuple[str, ...]]]


def _build_scans(triggers: Iterable[str]) -> list[Scan]:
    """One pattern per first letter of the triggers: `s(?=(k-|ecret|...))`. A literal first
    character lets the engine skip to each occurrence at memchr speed, where one alternation of
    all triggers (or a pattern per trigger) would cost 0.2 s (or 0.02 s each) over django's 34 MB.
    The lookahead finds overlapping triggers too. Each matched trigger also stands for the
    triggers that are its prefixes (`secret_key` -> `secret`)."""
    by_first: dict[str, set[str]] = {}
    for t in set(triggers):
        by_first.setdefault(t[0], set()).add(t)
    scans = []
    for first, group in sorted(by_first.items()):
        rests = sorted((t[1:] for t in group), key=len, reverse=True)
        pattern = re.compile(re.escape(first) + "(?=(" + "|".join(re.escape(r) for r in rests) + "))")
        implied = {t: tuple(u for u in group if t.startswith(u)) for t in group}
        scans.append((pattern, first, implied))
    return scans


_UNTRIGGERED = [d for d in DETECTORS if d.triggers is None]
_BY_TRIGGER: dict[str, list[int]] = {}
for _i, _d in enumerate(DETECTORS):
    for _t in _d.triggers or ():
        _BY_TRIGGER.setdefault(_t, []).append(_i)
_SCANS = _build_scans([*(t for d in DETECTORS for t in d.triggers or ()), *KEYWORDS])
# str.lower() can change a text's length ("İ" -> "i̇"); then only ASCII letters are lowered, so
# that positions found in the lowered text are positions in the text.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _trigger_hits(text: str) -> dict[str, list[int]]:
    """Where each trigger occurs in the text (case-insensitively)."""
    lowered = text.lower()
    if len(lowered) != len(text):
        lowered = text.translate(_ASCII_LOWER)
    hits: dict[str, list[int]] = {}
    for pattern, first, implied in _SCANS:
        for m in pattern.finditer(lowered):
            for t in implied[first + m.group(1)]:
                hits.setdefault(t, []).append(m.start())
    return hits


def _line_windows(text: str, positions: Iterable[int]) -> list[tuple[int, int]]:
    """The lines holding these positions, each from the line break before it (patterns that need
    a separator before a token see one) to the one after it."""
    windows: list[tuple[int, int]] = []
    for pos in sorted(positions):
        if windows and pos < windows[-1][1]:
            continue
        start = max(0, text.rfind("\n", 0, pos))
        end = text.find("\n", pos)
        windows.append((start, len(text) if end < 0 else end + 1))
    return windows


def find_spans(text: str, code: bool, strict: bool) -> list[Span]:
    """The secret spans of a text, overlaps merged, in order (see tasks/secrets.find_secrets)."""
    hits = _trigger_hits(text)
    whole = [(0, len(text))]
    spans: list[Span] = []
    for detector in _UNTRIGGERED:
        spans.extend(detector.spans(text, whole))
    found: dict[int, list[int]] = {}
    for trigger, positions in hits.items():
        for i in _BY_TRIGGER.get(trigger, ()):
            found.setdefault(i, []).extend(positions)
    for i, positions in found.items():
        spans.extend(DETECTORS[i].spans(text, _line_windows(text, positions)))
    keyword_hits = sorted((p, p + len(t)) for t in KEYWORDS for p in hits.get(t, ()))
    spans.extend(named_values(text, keyword_hits, code))
    if strict:
        spans.extend(file_values(text))
    return _merge(spans)


def _merge(spans: Iterable[Span]) -> list[Span]:
    merged: list[Span] = []
    for span in sorted(spans):
        if merged and span.start < merged[-1].end:
            last = merged[-1]
            best = last if last.rank <= span.rank else span
            merged[-1] = Span(last.start, max(last.end, span.end), best.kind, best.rank)
        else:
            merged.append(span)
    return merged
