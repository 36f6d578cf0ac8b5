from alembic import context
from sqlmodel import SQLModel

import orchestrator.ledger.ledger  # noqa: F401  (registers the tables on SQLModel.metadata)

# The connection comes from Ledger.upgrade already inside a transaction that holds the ledger's
# write lock: alembic then runs every migration in it (an "external transaction") and the caller
# commits them all at once, or none.
connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=SQLModel.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
