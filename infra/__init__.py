"""The topokeeper CDK app: one stack per account and region, one construct per concern."""
