"""What the parts agree on: ports, errors, names and constants, the config and event schemas, the stack's spec,
the deployment view and the operator's files. The stack (infra/) reads only these; the rest builds on them."""
