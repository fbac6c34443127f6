"""Credentials never travel inside a config: they go to the environment, the URL keeps `***`.

A composed config is written to launch.json, every checkpoint's meta.json, the lineage
store, MLflow params and artifacts, and Prefect's database; its hash names the run. So
right after composition a password found in `store.url` or `mlflow.tracking_uri` moves
to the standard place its client already reads:

- PostgreSQL: PGPASSWORD (libpq also reads ~/.pgpass and PGPASSFILE by itself);
- an MLflow tracking server (http/https): MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD.

The URL left in the config says `user:***@host`: whoever reads it sees that a password
was given and where it went, and the config hash no longer depends on it. `connectable`
turns such a URL back into one without a password, so that the driver looks in the
environment. Other backends have no such standard place: a password in their URL is
refused with the way to pass it instead.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import unquote, urlsplit, urlunsplit

REDACTED = "***"
SECRET_KEYS = ("store.url", "mlflow.tracking_uri")  # the config keys that may hold a password
HTTP_SCHEMES = ("http", "https")
PG_PASSWORD_ENV = "PGPASSWORD"
MLFLOW_USER_ENV, MLFLOW_PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
# SQLAlchemy's URL grammar (user `[^:/]*`, password `[^@]*`), so that text SQLAlchemy would
# read a password from is masked even where the rest of the URL does not parse (a bad port,
# a typo in the scheme). In free text it stops at a line end (and the user at a space).
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/\s]*):(?P<secret>[^@\n]*)@")
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<secret>[^&#\s'\"]*)", re.IGNORECASE)


@dataclass(frozen=True)
class Credentials:
    """What a URL carries: its redacted text and the secret taken out of it."""

    redacted: str
    backend: str
    username: Optional[str] = None
    password: Optional[str] = None  # None: none in the URL, or already `***`


def redact_text(text: str) -> str:
    """Every `scheme://user:password@` and `?password=` in free text, masked."""
    masked = _USERINFO.sub(lambda m: f"{m['head']}:{REDACTED}@", str(text))
    return _QUERY_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}", masked)


def redact_values(data: Any) -> Any:
    """`data` (JSON-like) with `redact_text` applied to every string in it, one at a time."""
    if isinstance(data, str):
        return redact_text(data)
    if isinstance(data, dict):
        return {key: redact_values(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [redact_values(value) for value in data]
    return data


def redact_url(url: Any) -> Any:
    """The URL with any password replaced by `***`; None stays None, garbage stays itself
    (masked by pattern if it still looks like it holds a password)."""
    if url is None:
        return None
    if hasattr(url, "render_as_string"):  # an already parsed SQLAlchemy URL
        return url.render_as_string(hide_password=True)
    return credentials(str(url)).redacted


def credentials(url: str) -> Credentials:
    """Split a URL into its redacted text and the username/password it carries."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in HTTP_SCHEMES:
        return _http_credentials(url, scheme)
    return _sql_credentials(url)


def _http_credentials(url: str, scheme: str) -> Credentials:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # e.g. a port that is not a number
        return Credentials(redact_text(url), scheme)
    if password is None:
        return Credentials(url, scheme)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    raw_user = userinfo.partition(":")[0]
    redacted = urlunsplit(parts._replace(netloc=f"{raw_user}:{REDACTED}@{hostport}"))
    secret = None if password == REDACTED else unquote(password)
    return Credentials(redacted, scheme, unquote(raw_user) or None, secret)


def _sql_credentials(url: str) -> Credentials:
    from sqlalchemy.engine import URL, make_url

    try:
        parsed = make_url(url)
    except Exception:  # ArgumentError, ValueError (bad port), ...: not a URL we can read
        return Credentials(redact_text(url), "unparsable")
    # psycopg also takes the password as a query parameter, which wins over the userinfo.
    password = parsed.query.get("password", parsed.password)
    if isinstance(password, tuple):
        password = password[-1]
    if password is None:
        return Credentials(url, parsed.get_backend_name(), parsed.username)
    if password == REDACTED and "password" not in parsed.query:
        return Credentials(url, parsed.get_backend_name(), parsed.username)  # keep its text
    query = {k: v for k, v in parsed.query.items() if k != "password"}
    masked = URL.create(parsed.drivername, parsed.username, REDACTED, parsed.host, parsed.port,
                        parsed.database, query)
    secret = None if password == REDACTED else password
    return Credentials(masked.render_as_string(hide_password=True), parsed.get_backend_name(),
                       parsed.username, secret)


def connectable(url: Any) -> Any:
    """The URL to hand to a driver: a `***` password removed, so that libpq (PGPASSWORD,
    ~/.pgpass, PGPASSFILE) or MLflow (MLFLOW_TRACKING_*) takes it from the environment."""
    if url is None:
        return None
    if hasattr(url, "render_as_string"):
        return _drop_sql_password(url) if url.password == REDACTED else url
    text = str(url)
    if f":{REDACTED}@" not in text:
        return text
    scheme = text.split("://", 1)[0].lower()
    from sqlalchemy.engine import make_url
    try:
        if scheme in HTTP_SCHEMES:
            parts = urlsplit(text)
            return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        parsed = make_url(text)
    except Exception:  # left as it is: composing the store reports what is wrong with it
        return text
    if parsed.password != REDACTED:
        return text
    return _drop_sql_password(parsed).render_as_string(hide_password=False)


def _drop_sql_password(parsed):
    from sqlalchemy.engine import URL

    return URL.create(parsed.drivername, parsed.username, None, parsed.host, parsed.port,
                      parsed.database, parsed.query)


def move_to_environment(cfg) -> list[str]:
    """Leave `***` in place of every password in `store.url` and `mlflow.tracking_uri`,
    and put the passwords where their clients read them. Returns the problems; when
    there are any, the environment is left untouched."""
    found: list[str] = []
    env: dict[str, str] = {}
    for key in SECRET_KEYS:
        section, field = getattr(cfg, key.split(".")[0]), key.split(".")[1]
        url = getattr(section, field)
        if not url:
            continue
        found_in_url = credentials(str(url))
        setattr(section, field, found_in_url.redacted)
        if found_in_url.password is not None:
            problem = _hand_over(key, found_in_url, env)
            found += [problem] if problem else []
    if not found:
        os.environ.update(env)
    return found


def _hand_over(key: str, found: Credentials, env: dict[str, str]) -> Optional[str]:
    """Route one password into `env`; or say why it cannot be and how to pass it."""
    if found.backend == "postgresql":
        if env.get(PG_PASSWORD_ENV, found.password) != found.password:
            return ("store.url and mlflow.tracking_uri carry different PostgreSQL passwords, but "
                    "libpq reads one PGPASSWORD per process: remove both from the URLs and put "
                    "them in ~/.pgpass (or the file PGPASSFILE names), one line per database: "
                    "host:port:database:user:password")
        # A password written in the URL wins over an inherited PGPASSWORD, as in libpq.
        env[PG_PASSWORD_ENV] = found.password
        return None
    if found.backend in HTTP_SCHEMES and key == "mlflow.tracking_uri":
        if found.username:
            env[MLFLOW_USER_ENV] = found.username
        env[MLFLOW_PASSWORD_ENV] = found.password
        return None
    return (f"{key}={found.redacted!r}: a password in a {found.backend} URL would be written into "
            "launch.json, every checkpoint, the lineage store and MLflow, and baton hands "
            "passwords over only through the environment (PostgreSQL: PGPASSWORD, ~/.pgpass or "
            "PGPASSFILE; an MLflow server: MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD); remove the password from the URL and give it to the "
            "driver through its own configuration")
