"""The admin HTTP API: health checks, metrics and REST over the log (docs/http.md).

`app.make_app` builds the FastAPI app, `server.HttpServer` runs it with uvicorn
on the broker's event loop, `auth` keeps the bearer tokens. Only `riverbed.cli`
imports this package.
"""
