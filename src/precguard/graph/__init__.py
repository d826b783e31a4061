"""Op graphs of a model on one device: export, read from recordings, diff.

``precguard graph export`` writes an :class:`~precguard.graph.model.OpGraph`
(from ``torch.export``, else from an op-level trace of one forward);
``precguard graph diff`` compares two graphs or two op-level recordings
(:func:`~precguard.graph.diff.diff_graphs`).
"""
