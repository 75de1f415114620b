"""``manage.py`` commands of the app: ``dexworker``, ``dev``, ``createtoken``, ``seed_demo``,
``sessionsearch_index`` (README "Management commands").

Wiring layer: a command may import any layer, and stays thin: it parses its options and calls
a service or selector. Tests in ``tests/agents_app/test_commands.py`` (``call_command``).
"""
