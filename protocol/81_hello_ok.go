package protocol

import "time"

// HelloOK accepts a Hello and states the session's parameters. Its layout is the same in every
// protocol version:
//
//	version u16 | server_name string | session_id string | heartbeat_interval duration |
//	session_timeout duration | max_frame_size u32 | max_message_size u32 | properties headers
type HelloOK struct {
	// Version is the protocol version chosen for the connection; every later frame uses it.
	Version uint16
	// ServerName identifies the broker instance (for logs).
	ServerName string
	// SessionID identifies this connection in the server's logs and admin API; quote it when
	// reporting a problem.
	SessionID string
	// HeartbeatInterval is the interval both sides must keep: each sends at least one frame per
	// interval, a Heartbeat when it has nothing else to send. Defaults to 10 s.
	HeartbeatInterval time.Duration
	// SessionTimeout is how long either side waits without receiving any frame before it
	// considers the peer dead and closes the connection (the server's members then leave their
	// groups and their leases are released). Defaults to 30 s, three heartbeat intervals.
	SessionTimeout time.Duration
	// MaxFrameSize is the largest frame, header included, that either side may send on this
	// connection, between MinMaxFrameSize and MaxMaxFrameSize. Defaults to 10 MiB.
	MaxFrameSize uint32
	// MaxMessageSize is the server's default bound on one message (key, header names and values,
	// payload); a topic may configure its own. Defaults to 1 MiB.
	MaxMessageSize uint32
	// Properties are free-form key/value pairs about the server ("server.version"), and the
	// extension point for capabilities of later versions.
	Properties map[string]string
}

// Opcode returns OpHelloOK.
func (*HelloOK) Opcode() Opcode { return OpHelloOK }

// FromServer marks HelloOK as a server message.
func (*HelloOK) FromServer() {}

// Encode appends the body to dst.
func (m *HelloOK) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpHelloOK)
	e.u16(m.Version)
	e.str("server_name", m.ServerName)
	e.str("session_id", m.SessionID)
	e.duration("heartbeat_interval", m.HeartbeatInterval)
	e.duration("session_timeout", m.SessionTimeout)
	e.u32(m.MaxFrameSize)
	e.u32(m.MaxMessageSize)
	e.headers("properties", m.Properties)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *HelloOK) Decode(src []byte) error {
	d := newDec(src, OpHelloOK)
	*m = HelloOK{
		Version:           d.u16("version"),
		ServerName:        d.str("server_name"),
		SessionID:         d.str("session_id"),
		HeartbeatInterval: d.duration("heartbeat_interval"),
		SessionTimeout:    d.duration("session_timeout"),
		MaxFrameSize:      d.u32("max_frame_size"),
		MaxMessageSize:    d.u32("max_message_size"),
		Properties:        d.headers("properties"),
	}
	if err := d.finish(); err != nil {
		*m = HelloOK{}
		return err
	}
	return nil
}
