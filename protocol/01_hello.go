package protocol

import "time"

// Hello opens a session. It is the first frame a client sends, right after the preamble, with a
// non-zero correlation id; the server answers HelloOK, or Error (UNSUPPORTED_VERSION,
// NOT_AUTHENTICATED) and closes the connection.
//
// Its layout is the same in every protocol version, so that negotiation always works:
//
//	min_version u16 | max_version u16 | client_name string | token string |
//	heartbeat_interval duration | properties headers
type Hello struct {
	// MinVersion and MaxVersion are the range of protocol versions the client speaks; the server
	// picks the highest version in both its range and this one.
	MinVersion uint16
	MaxVersion uint16
	// ClientName identifies the client application in server logs and admin listings (for
	// example "billing-worker-3"); may be empty.
	ClientName string
	// Token is the credential (a bearer token) when the server requires authentication; empty
	// otherwise.
	Token string
	// HeartbeatInterval is the interval the client asks for; 0 means the server's default (10 s).
	// The server may clamp it and announces the result in HelloOK.
	HeartbeatInterval time.Duration
	// Properties are free-form key/value pairs about the client, for logs and admin listings
	// ("client.library" = "spool-go", "client.version" = "1.2.0"). They are the extension point
	// for capabilities a later version adds without changing Hello's layout.
	Properties map[string]string
}

// Opcode returns OpHello.
func (*Hello) Opcode() Opcode { return OpHello }

// FromClient marks Hello as a client message.
func (*Hello) FromClient() {}

// Encode appends the body to dst.
func (m *Hello) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpHello)
	e.u16(m.MinVersion)
	e.u16(m.MaxVersion)
	e.str("client_name", m.ClientName)
	e.str("token", m.Token)
	e.duration("heartbeat_interval", m.HeartbeatInterval)
	e.headers("properties", m.Properties)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *Hello) Decode(src []byte) error {
	d := newDec(src, OpHello)
	*m = Hello{
		MinVersion:        d.u16("min_version"),
		MaxVersion:        d.u16("max_version"),
		ClientName:        d.str("client_name"),
		Token:             d.str("token"),
		HeartbeatInterval: d.duration("heartbeat_interval"),
		Properties:        d.headers("properties"),
	}
	if err := d.finish(); err != nil {
		*m = Hello{}
		return err
	}
	return nil
}
