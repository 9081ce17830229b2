"""Figures for the book, one module per topic (never per chapter). Shared style lives in kernels_src.plots."""
