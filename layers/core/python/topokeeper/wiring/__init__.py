"""The one composition root: the environment -> adapters -> each use case's dependencies, for the four Lambda
handlers, the login sync inside them, the operator CLI and the simulator."""
