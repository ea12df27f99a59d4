"""Flower's Control API messages, vendored from the flwr wheel (see README.md here).

flwr cannot be installed beside this service's dependencies (README.md beside this file
says why), so the generated protobuf modules the Control API needs are copied here with
their imports pointed at this package. They are used with this project's protobuf runtime:
generated for 5.29, accepted by the 7.x runtime the lock pins.
"""
