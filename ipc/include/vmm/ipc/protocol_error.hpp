#pragma once
/// @file
/// The error vmm::ipc raises when the process at the other end of a socket misbehaves.
///
///     try {
///       shared.receive_growth(socket);
///     } catch (const vmm::ipc::protocol_error& e) {   // bad_manifest is one too
///       report(e.what());
///       ::close(socket);   // the conversation is over; `shared` is as it was
///     }
///
/// vmm::invalid_argument promises that the caller passed a bad argument and nothing was
/// changed; what a peer sends is not the caller's argument, and the remedy differs. A
/// protocol_error means the conversation is over: the stream may stand anywhere inside a
/// message, so close the socket. Every vmm::ipc function that throws one has closed the
/// descriptors it received and released whatever it had imported or mapped, so nothing of
/// this process was changed or leaked. vmm::ipc::bad_manifest, a protocol_error, narrows it
/// to the contents of a manifest.

#include <stdexcept>

namespace vmm::ipc {

/// The peer broke the protocol: a frame with a wrong magic, a payload or descriptor count
/// over its limit or differing from what the header or the protocol calls for, descriptors
/// where none may travel, a hand-off message of the wrong type, round or size. The
/// conversation cannot continue: close the socket. Nothing of this process was changed or
/// leaked; what() names the socket or the message, and what was expected.
class protocol_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace vmm::ipc
