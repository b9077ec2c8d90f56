"""One engine for every door: the attempt sequence (``flow``), the effects it yields
(``effects``) and the sync and async drivers that interpret them (``drivers``)."""
