"""Finding a node's servers, and starting them where none runs: which server a task talks to
(``routing``), and the node servers a job starts itself (``node_servers``): the driver's context
(``node_context``) and its lease endpoint (``node_lease``), the start stage's tasks
(``host_start``) and what any task does on its host (``node_ensure``).

Imports only ``common``: nothing here speaks to a model server; it finds or starts one.
"""
