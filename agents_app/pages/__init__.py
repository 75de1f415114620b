"""The browser pages: portal, sessions, chat, approvals dashboard, usage, notifications.

Owns: the page views and their routes (``views``, ``urls``), what each template shows
(``page_selectors``), the template context every page gets (``context_processors``) and the
Content-Security-Policy header (``content_security``). Templates and scripts live in
``agents_app/templates`` and ``agents_app/static``.

May import: the REST API's serializers (``agents_app.api``), the domain and everything below it
(tests/test_layering.py).
"""
