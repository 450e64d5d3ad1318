"""Alembic environment: runs on the connection nf4-tune's db.connect hands over."""

from alembic import context

from nf4tune.db._models import Base
from nf4tune.db._engine import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:  # `alembic` CLI use: build an engine from the URL option
    from nf4tune.db._engine import make_engine, resolve_url

    engine = make_engine(resolve_url(context.config.get_main_option("sqlalchemy.url")))
    with engine.begin() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                      version_table=VERSION_TABLE)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                      version_table=VERSION_TABLE)
    with context.begin_transaction():
        context.run_migrations()
