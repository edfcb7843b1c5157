"""Generated protobuf and gRPC modules of the streambp.v1 protocol (see ../../generate.sh)."""
