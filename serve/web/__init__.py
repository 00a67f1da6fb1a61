"""The web UI the service serves on 127.0.0.1: Starlette routes over serve/api, Jinja2 pages, our own small JS/CSS."""
