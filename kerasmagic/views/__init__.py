"""How kerasmagic looks: text/HTML tables, SVG, the live widget, the sidebar's comm.

Views are handed snapshots, records and reports; they do not collect them.
"""
