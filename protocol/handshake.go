package protocol

// NegotiateVersion returns the highest version in both the client's range [clientMin,
// clientMax] and this package's [MinVersion, MaxVersion], or UNSUPPORTED_VERSION naming both
// ranges. Servers call it on Hello.
func NegotiateVersion(clientMin, clientMax uint16) (uint16, error) {
	v := min(clientMax, MaxVersion)
	if clientMin > clientMax || v < max(clientMin, MinVersion) {
		return 0, ErrUnsupportedVersion.Errorf("client speaks versions %d to %d, server %d to %d", clientMin, clientMax, MinVersion, MaxVersion)
	}
	return v, nil
}

// ClientHandshake opens a session on a fresh connection: it sends the preamble and hello (with
// correlation id 1), flushes, reads the server's preamble and its answer, and on success sets the
// max frame size of r and w to HelloOK.MaxFrameSize and their version to HelloOK.Version. A refusal is returned as the server's *Error
// (UNSUPPORTED_VERSION, NOT_AUTHENTICATED, ...). Zero MinVersion and MaxVersion in hello mean
// this package's range.
func ClientHandshake(r *Reader, w *Writer, hello *Hello) (*HelloOK, error) {
	h := *hello
	if h.MinVersion == 0 && h.MaxVersion == 0 {
		h.MinVersion, h.MaxVersion = MinVersion, MaxVersion
	}
	if err := w.WritePreamble(); err != nil {
		return nil, err
	}
	if err := w.WriteMessage(1, &h); err != nil {
		return nil, err
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	if err := r.ReadPreamble(); err != nil {
		return nil, err
	}
	corr, m, err := r.ReadServerMessage()
	if err != nil {
		return nil, err
	}
	switch m := m.(type) {
	case *HelloOK:
		if corr != 1 {
			return nil, ErrUnexpectedFrame.Errorf("HelloOK with correlation id %d, want 1", corr)
		}
		if m.MaxFrameSize < MinMaxFrameSize || m.MaxFrameSize > MaxMaxFrameSize {
			return nil, ErrMalformedFrame.Errorf("HelloOK max frame size %d is outside [%d, %d]", m.MaxFrameSize, MinMaxFrameSize, MaxMaxFrameSize)
		}
		if m.Version < h.MinVersion || m.Version > h.MaxVersion {
			return nil, ErrUnsupportedVersion.Errorf("server chose version %d outside the client's %d to %d", m.Version, h.MinVersion, h.MaxVersion)
		}
		r.SetMaxFrameSize(int(m.MaxFrameSize))
		w.SetMaxFrameSize(int(m.MaxFrameSize))
		r.SetVersion(m.Version)
		w.SetVersion(m.Version)
		return m, nil
	case *Error:
		return nil, m
	default:
		return nil, ErrUnexpectedFrame.Errorf("%s before HelloOK", m.Opcode())
	}
}
