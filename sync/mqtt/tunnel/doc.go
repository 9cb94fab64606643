// Package tunnel carries byte streams over a message link, so that the
// bridge reaches the kubelet API of a node it can reach only through the
// MQTT broker (kubectl logs -f, exec, attach and port-forward upgrades,
// /metrics). The bridge's Dialer dials a stream to a node and gets a
// net.Conn; the node's Listener is a net.Listener whose Accept returns a
// net.Conn per stream, for a plain http.Server.
//
// The package knows nothing of MQTT: each end is given a function that
// publishes one frame to the peer, is handed the frames the peer sent
// (Handle, which never blocks), and is told when the link is gone
// (Reset). sync/mqtt and sync/bridge carry the frames on a node's
// rpc/down and rpc/up topics with QoS 1.
//
// # Frames
//
// A frame is a small header and a payload:
//
//	version  1 byte    1
//	kind     1 byte    open 1, accept 2, data 3, ack 4, fin 5, close 6
//	session  16 bytes  the stream; random, made by the dialer
//	nonce    8 bytes   the listener's random number for the stream;
//	                   0 in an open and in the close refusing one
//	seq      uvarint   data and fin: 1, 2, 3… in each direction;
//	                   close: the last data or fin its sender sent; else 0
//	ack      uvarint   open, accept: the sender's window; data, fin, ack:
//	                   the bytes the sender's reader consumed in all
//	payload  the rest  data: the bytes; close: the reason (empty: a
//	                   clean close)
//
// Varints are minimal, so a frame has one encoding (DecodeFrame,
// Frame.Append).
//
// # Streams
//
// Dial publishes an open and waits OpenTimeout for the answer: an accept,
// which carries the nonce, or a close with the node's reason for refusing
// ("too many streams: 16 open (mqtt.maxStreams)"). The Listener hands a
// stream to Accept once its accept is published. Then both ends are
// alike. CloseWrite sends a fin: the peer reads io.EOF after the data,
// and may still write. Close sends a clean close: the peer reads io.EOF
// after the data, and can write no more. A stream that ends otherwise
// (a lost frame, a protocol error, IdleTimeout without a frame either
// way, a failed publish) sends a close with the reason, which the peer's
// Read and Write return as "closed by peer: reason" once the data
// received is read. Reset ends every stream of a link at once, telling
// nobody. Deadlines work as with TCP, on the injected clock; a passed
// one is os.ErrDeadlineExceeded, also for a Read or Write waiting.
//
// # Flow control
//
// An end may have at most the peer's window (Window, told in the open or
// accept) of data unacknowledged on a stream: Write waits for credit.
// Read returns credit, cumulatively, once it consumed half its window
// since it last did, in an ack frame, or in any data or fin frame sent
// meanwhile. A peer that sends past the window breaks the protocol and
// the stream ends, so what Handle buffers per stream is at most the
// window.
//
// # Duplicates, loss and replay
//
// QoS 1 keeps the order of one publisher's messages on a topic but may
// deliver one twice. A receiver takes data and fin frames in sequence:
// one it had is a duplicate and dropped; one past the next means frames
// were lost, and the stream ends ("frames lost"). Acks are cumulative, so
// duplicates do no harm. The bridge may sign its frames, and a signed
// frame can be replayed: so every frame after the open must carry the
// nonce the listener chose at accept. A replayed open makes only an empty
// stream (the bridge, which knows no such stream, closes it), and the
// frames of old streams are dropped.
//
// # Caveats
//
// Write publishes its frames itself, one at a time, so a Publish that
// waits for the broker's acknowledgement limits a stream to a frame per
// round trip, whatever the window. Read publishes its acks itself too,
// so it may wait for a Publish. A write deadline that passes during a
// Publish ends the stream, as the frame may or may not have gone (as
// with TLS). Streams are not resumed: a Reset ends them, and the peer's
// HTTP client dials again. The Listener's Close stops new streams only,
// as a TCP listener's does, so http.Server.Shutdown can drain.
package tunnel
