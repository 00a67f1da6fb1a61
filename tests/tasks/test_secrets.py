"""The secrets stage: each planted form is masked with its name kept, code and prose are left alone,
line numbers survive, and which files are secrets by name."""

from __future__ import annotations

import pytest

from ctxlake.tasks.secrets import MaskReport, find_secrets, is_secret_file, mask_text

# Fake values built from parts, so the repository holds no string a secret scanner would flag.
PW = "Tr0ub4dor" + "-x9Q"
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
AWS_ID = "AKIA" + "QWERTYUIOPASDFGH"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG" + "/bPxRfiCYzEXAMPLEKEY"
STRIPE = "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"
RANDOM_KEY = "x8Kq2Lm9" + "Pz4Rt7Vw3Yb6"
PEM_BODY = "MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgwMbRvI0MBZhpF\n" + "q0Zb3tYdN8pQ2fLkR5sT1uV7wX9yZ0aB3cD4eF6gH8iJ0kL2mN4oP6qR8sT0uV2w"
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}\n-----END RSA PRIVATE KEY-----"

# (text, path or None for conversation text, the secret, what must stay around the mask)
FORMS = [
    (f"config/.env:3:DATABASE_PASSWORD={PW}", None, PW, "config/.env:3:DATABASE_PASSWORD=[REDACTED:"),
    (f"Note: password={PW} for staging", None, PW, "Note: password=[REDACTED:"),
    (f"SECRET_KEY = '{PW}'\nDEBUG = True\n", "mysite/settings.py", PW, "SECRET_KEY = '[REDACTED:"),
    (f"Production\napi_key: {RANDOM_KEY}\n", None, RANDOM_KEY, "api_key: [REDACTED:"),
    (f"staging api_key: {RANDOM_KEY}", None, RANDOM_KEY, "api_key: [REDACTED:"),
    (f'  "PASSWORD": "{PW}",', "mysite/settings.py", PW, '"PASSWORD": "[REDACTED:'),
    (f"const client = new Octokit({{ auth: '{GITHUB}' }});", "web/app.js", GITHUB, "auth: '[REDACTED:github_token]'"),
    (f"database:\n  password: {PW}\n", "config/app.yaml", PW, "password: [REDACTED:"),
    (f'[db]\npassword = "{PW}"\n', "config.toml", PW, 'password = "[REDACTED:'),
    (f"[client]\npassword={PW}\n", "my.cnf", PW, "password=[REDACTED:"),
    (f'{{"db": {{"password": "{PW}"}}}}', "config.json", PW, '"password": "[REDACTED:'),
    (f'export GITHUB_TOKEN="{GITHUB}"', "deploy.sh", GITHUB, 'GITHUB_TOKEN="[REDACTED:'),
    (f"ENV API_TOKEN={RANDOM_KEY}", "Dockerfile", RANDOM_KEY, "ENV API_TOKEN=[REDACTED:"),
    (f"      - POSTGRES_PASSWORD={PW}", "docker-compose.yml", PW, "POSTGRES_PASSWORD=[REDACTED:"),
    (f"aws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}", None, AWS_SECRET, "aws_secret_access_key = [REDACTED:"),
    (f"key id {AWS_ID} in the log", None, AWS_ID, "key id [REDACTED:"),
    (f"DATABASE_URL=postgres://app:{PW}@db.internal:5432/app", None, PW, "postgres://app:[REDACTED:url_password]@db.internal"),
    (f"curl -H 'Authorization: Bearer {RANDOM_KEY}' https://api.example.com", None, RANDOM_KEY, "Authorization: Bearer [REDACTED:"),
    (f"curl -u admin:{PW} https://ci.example.com", None, PW, "curl -u admin:[REDACTED:"),
    (f"mysql -u root --password {PW} shop", None, PW, "--password [REDACTED:"),
    (f"<password>{PW}</password>", "pom.xml", PW, "<password>[REDACTED:"),
    (f"stripe.api_key = '{STRIPE}'", "billing.py", STRIPE, "stripe.api_key = '[REDACTED:"),
    (f"signing_key = '{RANDOM_KEY}'", "app/keys.py", RANDOM_KEY, "signing_key = '[REDACTED:"),
    (f"requests.get(url, auth=('admin', '{PW}'))", "api.py", PW, "auth=('admin', '[REDACTED:"),
    (f"machine api.example.com login bot password {PW}", None, PW, "password [REDACTED:"),
    (f"docker login -u bot -p {PW} registry.example.com", None, PW, "-p [REDACTED:"),
    (f"mysql -u root -p{PW} shop", None, PW, "-p[REDACTED:"),
    (f"my password is {PW} on staging", None, PW, "my password is [REDACTED:"),
    (f"The password for the admin account: {PW} (rotate it)", None, PW, "admin account: [REDACTED:"),
    (f"the db pw is {PW} until Friday", None, PW, "db pw is [REDACTED:password]"),
    (f"staging PW: {PW}", None, PW, "PW: [REDACTED:password]"),
    (f"sshpass -p '{PW}' ssh deploy@web1", None, PW, "sshpass -p '[REDACTED:"),
    (f"cat deploy_key\n{PEM}\nthen ssh-add", None, "q0Zb3tYdN8pQ2fLkR5sT1uV7", "-----BEGIN RSA PRIVATE KEY-----\n[REDACTED:private_key]"),
]


@pytest.mark.parametrize(("text", "path", "secret", "kept"), FORMS, ids=[f[0][:32] for f in FORMS])
def test_each_form_is_masked_and_its_name_kept(text: str, path: str | None, secret: str, kept: str) -> None:
    report = MaskReport()
    out = mask_text(text, path, report)
    assert secret not in out and secret[: len(secret) // 2] not in out
    assert kept in out, out
    assert report.masked >= 1 and sum(report.by_kind.values()) == report.masked


@pytest.mark.parametrize(("text", "path"), [
    ("def get_token(self):\n    return self.tokens[0]", "a.py"),
    ("max_tokens: 256\ntoken_count = 12", None),
    ("The password field is optional.", None),
    ('password = form.cleaned_data["password"]\ntoken = next_token\n', "views.py"),
    ("def login(self, password: str) -> None:", "auth.py"),
    ("if token == \"COLLATE\":\n    pass", "introspection.py"),
    ('REASON_CSRF_TOKEN_MISSING = "CSRF token missing."', "csrf.py"),
    ('SESSION_KEY = "_auth_user_id"\nPASSWORD_RESET_TIMEOUT = 259200', "auth/__init__.py"),
    ("expected_key = AWSS3Storage.prefix + folder + key", "test_storage.py"),
    ('{% url "password_reset_confirm" uidb64=uid token=token %}', "email.html"),
    ("see https://github.com/o/r/blob/main/README.md", None),
    ("sha 3f2a1c9e8b7d6540a1b2c3d4e5f60718293a4b5c", None),
    ("Authorization header missing", None),
    ("password: ${DB_PASSWORD}\ntoken: {{ secrets.TOKEN }}", "ci.yml"),
    ("permissions:\n  id-token: write", ".github/workflows/publish.yaml"),
    ("Never pass :data:`~flask.current_app` as sender", "signals.rst"),
    ("input[type=password]:focus { outline: none }", "base.css"),
    ('User.objects.filter(password__startswith="md5$$")', "releases.txt"),
    ("The token is expired; the password is required.", None),
    ("docker run -p 8080:80 web", None),
    ("Reset the password for the user: see the docs.", None),
    ('sshpass -p "$DEPLOY_PASSWORD" ssh deploy@web1', "deploy.sh"),
    ("pw = pwd.getpwnam(user)\nfor pw in passwords:\n    check(pw)", "users.py"),
    ("the pw is wrong; the pwm fan speed is 4000", None),
])
def test_code_and_prose_are_left_alone(text: str, path: str | None) -> None:
    assert mask_text(text, path) == text


def test_a_key_block_keeps_its_lines_and_frame() -> None:
    text = f"line one\n{PEM}\nline after\n"
    out = mask_text(text, "deploy/README.md")
    assert out.count("\n") == text.count("\n")
    assert out.splitlines()[-1] == "line after"
    assert "-----END RSA PRIVATE KEY-----" in out and PEM_BODY[:20] not in out
    # A JSON string holds a key with escaped line breaks (a service-account file).
    escaped = '{"private_key": "' + PEM.replace("\n", "\\n") + '\\n"}'
    assert PEM_BODY[:20] not in mask_text(escaped, "sa.json")
    # A conversation text cut in the middle of a key masks to its end.
    assert "q0Zb3tYd" not in mask_text(PEM[:-40], None)


def test_a_secret_file_opted_into_the_index_has_every_value_masked() -> None:
    env = f"DEBUG=true\nPORT=8000\nDATABASE_HOST=db.internal\nSTRIPE={STRIPE}\nAPP_SALT={PW}\n"
    out = mask_text(env, "config/.env")
    assert "DEBUG=true" in out and "PORT=8000" in out
    assert "db.internal" not in out and STRIPE not in out and PW not in out
    # The same text in an ordinary file masks only what names or formats announce.
    assert "db.internal" in mask_text(env, "notes.txt")


def test_positions_survive_text_whose_lowercase_is_longer() -> None:
    text = f"İstanbul İzmir: password={PW} ok"
    spans = find_secrets(text)
    assert [text[s.start:s.end] for s in spans] == [PW]


def test_overlapping_finds_are_one_mask_with_the_specific_kind() -> None:
    report = MaskReport()
    out = mask_text(f"GITHUB_TOKEN={GITHUB}", None, report)
    assert out == "GITHUB_TOKEN=[REDACTED:github_token]" and report.masked == 1


@pytest.mark.parametrize(("path", "secret"), [
    (".env", True), ("config/.env.production", True), ("prod.env", True), ("deploy/id_rsa", True),
    ("keys/id_ed25519", True), ("certs/server.pem", True), ("tls/server.KEY", True), ("store.p12", True),
    ("android/release.keystore", True), ("credentials.json", True), (".npmrc", True), (".pypirc", True),
    (".netrc", True), ("secrets.yaml", True), ("infra/prod.tfvars", True),
    (".env.example", False), ("id_rsa.pub", False), ("credentials.py", False), ("keys.py", False),
    ("docs/secrets.md", False), ("app.py", False),
])
def test_secret_files_by_name(path: str, secret: bool) -> None:
    assert is_secret_file(path) is secret


def test_a_scraper_error_line_that_quotes_a_record_is_masked() -> None:
    from ctxlake.tasks.scrape.base import ScrapeOutput

    out = ScrapeOutput()
    try:
        raise TypeError(f"unhashable value in {{'password': '{PW}'}}")
    except TypeError as exc:
        out.parser_failed(exc, "log.jsonl:3")
    assert out.warnings and PW not in out.warnings[0] and "[REDACTED:" in out.warnings[0]
