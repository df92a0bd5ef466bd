"""Formats that cross a process or a disk as bytes, on the bottom floor (docs/architecture.md): they
import nothing of rocketray's subpackages but the package root, and every other package may import them.

The record codec (``message``) and a producer's batch (``batch``, with the C record loops
``_records``); the client port's frames (``client_frames``, ``client_control``) and the answers they
carry (``put_result``, ``pull_result``); the HA packets (``ha_protocol``); the controller's requests,
response headers and codes (``controller_api``, ``controller_headers``, ``controller_codes``); a
delayed message's names and levels (``delayed``); the offset-commit record (``offset_records``)."""
