"""The tuner as a service: ``autoslapo serve`` (FastAPI), ``autoslapo worker``, tokens, a web page.

``create_app(store, ServiceSettings(...))`` builds the HTTP app over an open store; ``Worker(store)``
claims queued study jobs and runs them with ``tuner.tune``. Heavy: import only from the CLI or tests.
"""

from __future__ import annotations

from autoslapo.service.app import ServiceSettings, create_app
from autoslapo.service.auth import Caller, TokenCheck, create_token
from autoslapo.service.jobs import StudyRequest, check_name
from autoslapo.service.worker import Worker

__all__ = ["Caller", "ServiceSettings", "StudyRequest", "TokenCheck", "Worker", "check_name", "create_app",
           "create_token"]
