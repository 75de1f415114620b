"""Model usage, cost and budgets (issue 27 "Cost and usage", "Budgets").

Owns: the price of one model call (``pricing``), per-call usage rows and their sums
(``usage_records``), and spending limits per user or agent (``budgets``).

May import: the foundation only.
"""
