"""Why an object-store URL cannot hold a run's record or checkpoints here, in one line that names the fix.

A scheme must keep what is written beyond this process and read it back (s3://, gs://, abfs://, hdfs://, ...):
memory:// keeps it in this process only, and archives, caches and web servers (zip://, tar://, http://, ...) take
no writes. A URL needs a bucket, no control characters and its package installed; an error the store's client
raises (named by its class, whose module is never imported here) becomes the problem it shows: no bucket, no
credentials, no permission, or an endpoint that does not answer. Reads nothing but the environment's endpoint
variables; endpoint_problem opens one TCP connection.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
from urllib.parse import urlsplit

from launcher.runtime.formatting import first_line

# fsspec's schemes of stores that keep what is written and take writes; its other known ones are refused
STORES = frozenset(("s3", "s3a", "gs", "gcs", "abfs", "az", "hdfs", "arrow_hdfs", "webhdfs", "oci", "ocilake", "oss",
                    "tos", "tosfs", "lakefs", "sftp", "ssh", "ftp", "smb", "webdav", "dbfs", "root", "box", "dropbox",
                    "gdrive"))
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}  # scheme -> the setup.cfg extra that installs it
NEEDS = {"hdfs": "pyarrow", "arrow_hdfs": "pyarrow"}  # imported only once the file system is made, not with its class
ENDPOINTS = {"s3": "AWS_ENDPOINT_URL", "s3a": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST",
             "gcs": "STORAGE_EMULATOR_HOST"}
CREDENTIALS = {"s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
               "gs": "GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`"}
NO_CREDENTIALS = frozenset(("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                            "DefaultCredentialsError", "RefreshError"))
CLIENT_LOGGERS = ("gcsfs", "s3fs", "fsspec", "aiobotocore", "botocore", "google")
# errors of a store that did not answer (the network, the endpoint), by class name along the cause chain
UNANSWERED = frozenset(("ConnectionError", "TimeoutError", "EndpointConnectionError", "ConnectTimeoutError",
                        "ReadTimeoutError", "ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError",
                        "ClientOSError", "TransportError"))
CONNECT_TIMEOUT_S = 5.0
OTHERS = "use a store that keeps it: s3://, gs://, abfs://, hdfs://, ..."


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower()


def family(url: str) -> str:
    """s3a -> s3, gcs -> gs: the scheme whose variables and extra a message names."""
    name = scheme_of(url)
    return {"s3a": "s3", "gcs": "gs"}.get(name, name)


def url_problem(url: str) -> str | None:
    """What is wrong with the URL itself, before any package or network: its characters, its bucket, its scheme."""
    name, rest = scheme_of(url), url.split("://", 1)[1]
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "holds a control character (a newline, a tab): retype it"
    if not rest.split("/", 1)[0]:
        return f"names no bucket: write {name}://BUCKET/PREFIX"
    if name == "memory":
        return f"memory:// keeps what is written in this process only, and the run's record would go with it: {OTHERS}"
    if name not in STORES and _known(name):
        return f"{name}:// takes no writes here (an archive, a cache or a web server): {OTHERS}"
    return None


def _known(name: str) -> bool:
    from fsspec.registry import known_implementations, registry

    return name in known_implementations or name in registry


def missing_package(url: str) -> str | None:
    """Why url's scheme cannot be used here (no fsspec implementation, or its package, installed), else None."""
    import fsspec

    name = scheme_of(url)
    try:
        fsspec.get_filesystem_class(name)
    except ImportError:
        return f"{name}:// needs a package that is not installed: {install(url)}"
    except ValueError:
        return f"{name}:// is not a storage scheme fsspec knows: use s3://, gs:// or another fsspec URL"
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        return f"{name}:// needs a package that is not installed: pip install {NEEDS[name]}"
    return None


def install(url: str) -> str:
    name = scheme_of(url)
    extra = EXTRAS.get(name)
    return f"pip install 'torch-launcher[{extra}]'" if extra else f"install the fsspec implementation for {name}://"


def endpoint_problem(url: str) -> str | None:
    """An endpoint the environment names for url's store that takes no connection: said in seconds, not after the
    client's retries (gcsfs: about 30 s of them)."""
    variable = ENDPOINTS.get(scheme_of(url))
    endpoint = os.environ.get(variable, "") if variable else ""
    if not endpoint:
        return None
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname or "localhost", port), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        return (f"cannot reach the object store at {endpoint} ({e.__class__.__name__}: {getattr(e, 'strerror', '') or e}): "
                f"check {variable} and the network")
    return None


def explain(error: BaseException, url: str, key: str) -> str:
    """The problem a store's error shows, for `{key}={url}: ...` (key: checkpoint.dir, output_dir, or a command)."""
    names = _class_names(error)
    store = family(url)
    if isinstance(error, ImportError):
        return f"{scheme_of(url)}:// needs a package that is not installed ({first_line(error)}): {install(url)}"
    if names & NO_CREDENTIALS:
        how = CREDENTIALS.get(store, "the store's credentials in the environment")
        return f"no credentials for {store}:// were found ({min(names & NO_CREDENTIALS)}): set {how}"
    if isinstance(error, FileNotFoundError):
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        return f"the bucket {bucket} does not exist: create it, or fix the bucket name in {key}"
    if isinstance(error, PermissionError):
        how = CREDENTIALS.get(store, "the store's credentials")
        return f"not permitted with these credentials ({first_line(error)}): check {how} and the bucket's permissions"
    variable = ENDPOINTS.get(scheme_of(url))
    where = os.environ.get(variable, "") if variable else ""
    check = f"check {variable}" if variable else "check the store's address"
    return (f"cannot reach the object store{f' at {where}' if where else ''} ({error.__class__.__name__}: "
            f"{first_line(error)}): {check} and the network")


def unanswered(error: BaseException) -> bool:
    """Whether error says the store did not answer (as opposed to an answer: no such bucket, no permission)."""
    return bool(_class_names(error) & UNANSWERED)


def is_store_error(error: BaseException) -> bool:
    """An error from talking to a store (the OS's, or a client library's), not a bug of the launcher's own code."""
    module = type(error).__module__.split(".")[0]
    if module == "launcher":
        return False
    return isinstance(error, (OSError, ImportError, TimeoutError)) or module != "builtins"


def quiet_clients() -> None:
    """The store clients log their retries with tracebacks (gcsfs: each failed request, once out of retries): the
    launcher says the problem in its own line; their records reach no console (a handler of its own, and none
    above it used)."""
    for name in CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(logging.NullHandler())
            logger.propagate = False


def _class_names(error: BaseException) -> set[str]:
    names: set[str] = set()
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 8:
        names.update(cls.__name__ for cls in type(current).__mro__)
        current, seen = current.__cause__ or current.__context__, seen + 1
    return names
