package protocol

// GoodbyeOK answers a Goodbye; the connection closes right after it. Its body is empty.
type GoodbyeOK struct{}

// Opcode returns OpGoodbyeOK.
func (*GoodbyeOK) Opcode() Opcode { return OpGoodbyeOK }

// FromClient marks GoodbyeOK as a client message.
func (*GoodbyeOK) FromClient() {}

// FromServer marks GoodbyeOK as a server message.
func (*GoodbyeOK) FromServer() {}

// Encode appends nothing: the body is empty.
func (m *GoodbyeOK) Encode(dst []byte) ([]byte, error) { return dst, nil }

// Decode checks that src is empty.
func (m *GoodbyeOK) Decode(src []byte) error {
	d := newDec(src, OpGoodbyeOK)
	return d.finish()
}
