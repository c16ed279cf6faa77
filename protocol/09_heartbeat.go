package protocol

import "time"

// Heartbeat is a liveness probe either side sends when it has sent no other frame for one
// heartbeat interval (HelloOK.HeartbeatInterval). The receiver answers HeartbeatOK at once with
// the same correlation id.
//
//	time time
type Heartbeat struct {
	// Time is the sender's clock when it sent the frame. It is echoed back, so the sender can
	// measure the round trip; it is never used for broker decisions (they use the broker's
	// clock).
	Time time.Time
}

// Opcode returns OpHeartbeat.
func (*Heartbeat) Opcode() Opcode { return OpHeartbeat }

// FromClient marks Heartbeat as a client message.
func (*Heartbeat) FromClient() {}

// FromServer marks Heartbeat as a server message.
func (*Heartbeat) FromServer() {}

// Encode appends the body to dst.
func (m *Heartbeat) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpHeartbeat)
	e.time("time", m.Time)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *Heartbeat) Decode(src []byte) error {
	d := newDec(src, OpHeartbeat)
	*m = Heartbeat{Time: d.time("time")}
	if err := d.finish(); err != nil {
		*m = Heartbeat{}
		return err
	}
	return nil
}
