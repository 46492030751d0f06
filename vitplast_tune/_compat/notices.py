"""List other projects' start-up notices the command line quiets, each with the lowest level still shown."""

from __future__ import annotations

import logging

STARTUP_NOTICES = {
    # "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out...": a warning
    # at every start of a local Ray instance (``enable_token_auth_by_default``), the token itself in ~/.ray.
    "ray._private.authentication.authentication_token_setup": logging.ERROR,
    # "Creating initial MLflow database tables...": INFO, when a search makes its SQLite tracking store.
    "mlflow.store.db.utils": logging.WARNING,
    # Alembic's "Context impl SQLiteImpl." and "Will assume non-transactional DDL.", as MLflow makes those tables.
    "alembic.runtime.migration": logging.WARNING,
}
