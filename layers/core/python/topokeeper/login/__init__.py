"""One SSH host identity for a cluster's login nodes: generation (operator CLI) and the node installer."""
