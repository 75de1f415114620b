"""A minimal Django project that installs dexagents as apps (tests/test_package.py copies it
into a temporary directory and runs it in a fresh virtualenv; docs/install-as-app.md quotes it)."""
