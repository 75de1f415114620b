"""Kept path for host projects: ``python -m agents_app.demo_model``, as docs named it before
the app had packages. The demo model is ``agents_app.demo.model_server``; this runs it."""

from agents_app.demo.model_server import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
