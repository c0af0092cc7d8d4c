"""What a person reads of gated data: plots, statistics, quality flags and the report.

``plotting`` (events turned into what a scatter plot or histogram needs: density bins, a fixed
display subsample, axis ticks; nothing is drawn here) with ``population_view`` (each bin coloured
by its majority population), ``marker_stats`` (median, geometric mean
and CV of each marker over a population's cells), ``qc`` (saturation at ``$PnR - 1``, time
drift, which compensation was applied), ``report`` (the batch table of patient x population
counted from the per-cell populations, and the one-page HTML report drawing every gate kind)
and ``svg_plots`` (the report's scatter plots and histograms drawn as inline SVG).
Import each name from its module; this package re-exports nothing.
"""
