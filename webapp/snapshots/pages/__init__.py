"""What people see: the pages (``views``), the charts (``charts``, the only module importing Bokeh;
``chartpage``), the wording of figures (``formatting``), the explore stores read for digging
(``digging``), the status page's wait (``waiting``), what the pages and the API answer with
(``payloads``). Fifth floor: imports everything below it, never the worker."""
