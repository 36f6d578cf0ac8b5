from alembic import context
from sqlmodel import SQLModel

import orchestrator.ledger  # noqa: F401  (registers the tables on SQLModel.metadata)

target_metadata = SQLModel.metadata
engine = context.config.attributes["engine"]

with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()
    if connection.in_transaction():
        connection.commit()
