//! Reports of simulated runs: an aligned table, JSON records, SVG plots and an HTML page.
