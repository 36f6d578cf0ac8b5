from alembic import context
from sqlalchemy import text
from sqlmodel import SQLModel

import orchestrator.ledger  # noqa: F401  (registers the tables on SQLModel.metadata)

target_metadata = SQLModel.metadata
engine = context.config.attributes["engine"]

with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # orch processes meeting a new team ledger at once: one migrates, the others wait for
            # it (DDL is transactional there) and then find the schema at head.
            connection.execute(text("SELECT pg_advisory_xact_lock(5260571)"))
        context.run_migrations()
    if connection.in_transaction():
        connection.commit()
