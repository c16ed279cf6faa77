package protocol

import "time"

// HeartbeatOK answers a Heartbeat.
//
//	echo time | time time
type HeartbeatOK struct {
	// Echo is the Heartbeat's Time, unchanged.
	Echo time.Time
	// Time is the responder's clock; a client may use it to estimate its clock skew against the
	// broker (whose clock decides leases, retention and FROM_TIMESTAMP).
	Time time.Time
}

// Opcode returns OpHeartbeatOK.
func (*HeartbeatOK) Opcode() Opcode { return OpHeartbeatOK }

// FromClient marks HeartbeatOK as a client message.
func (*HeartbeatOK) FromClient() {}

// FromServer marks HeartbeatOK as a server message.
func (*HeartbeatOK) FromServer() {}

// Encode appends the body to dst.
func (m *HeartbeatOK) Encode(dst []byte) ([]byte, error) {
	e := newEnc(dst, OpHeartbeatOK)
	e.time("echo", m.Echo)
	e.time("time", m.Time)
	return e.done()
}

// Decode replaces m with the body in src.
func (m *HeartbeatOK) Decode(src []byte) error {
	d := newDec(src, OpHeartbeatOK)
	*m = HeartbeatOK{Echo: d.time("echo"), Time: d.time("time")}
	if err := d.finish(); err != nil {
		*m = HeartbeatOK{}
		return err
	}
	return nil
}
