package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/errmap"
	"github.com/spoolmq/spool/internal/storage"
	"github.com/spoolmq/spool/protocol"
)

// httpError is an error of the HTTP layer itself that has no entry in the protocol's error table
// (an unknown route, a wrong method, a DLQ entry that does not exist).
type httpError struct {
	status  int
	code    string
	message string
}

func (e *httpError) Error() string { return e.code + ": " + e.message }

func httpErr(status int, code, format string, args ...any) *httpError {
	return &httpError{status: status, code: code, message: fmt.Sprintf(format, args...)}
}

// errorBody is the JSON body of every error response; errorDetail its error, whose Code is the
// protocol error name (docs/protocol.md section 9.2), or one of the HTTP-only names NOT_FOUND,
// METHOD_NOT_ALLOWED.
type (
	errorBody   = api.ErrorBody
	errorDetail = api.ErrorDetail
)

// statusForCode maps a protocol error code to an HTTP status.
func statusForCode(code uint16) int {
	switch code {
	case protocol.CodeMalformedFrame, protocol.CodeInvalidArgument, protocol.CodeOffsetOutOfRange,
		protocol.CodeUnknownOpcode, protocol.CodeUnsupportedVersion, protocol.CodeUnexpectedFrame,
		protocol.CodeUnknownCommand, protocol.CodeUnknownHandle:
		return http.StatusBadRequest
	case protocol.CodeNotAuthenticated:
		return http.StatusUnauthorized
	case protocol.CodeSessionTimeout:
		return http.StatusRequestTimeout
	case protocol.CodePermissionDenied:
		return http.StatusForbidden
	case protocol.CodeTopicNotFound, protocol.CodeSubNotFound, protocol.CodeBindingNotFound:
		return http.StatusNotFound
	case protocol.CodeTopicExists, protocol.CodeTopicHasSubs, protocol.CodeNoSubscriptions,
		protocol.CodeSubExists, protocol.CodeSubNotActive, protocol.CodeInvalidTransition,
		protocol.CodeLeaseNotHeld, protocol.CodeBindingExists, protocol.CodeStaleGeneration,
		protocol.CodeLimitExceeded, protocol.CodeTopicChanged:
		return http.StatusConflict
	case protocol.CodeFrameTooLarge, protocol.CodeMessageTooLarge, protocol.CodeLineTooLong:
		return http.StatusRequestEntityTooLarge
	case protocol.CodeRateLimited:
		return http.StatusTooManyRequests
	case protocol.CodeClosed, protocol.CodeOverloaded, protocol.CodeStorageUnavailable:
		return http.StatusServiceUnavailable
	case protocol.CodeStorageFull:
		return http.StatusInsufficientStorage
	case protocol.CodeTimeout:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// writeError writes err as a JSON error and returns its code. Storage and broker errors are mapped
// by errmap.ErrorFrom, so the HTTP API and the TCP protocol report the same code for the same
// condition; a request body over the limit is FRAME_TOO_LARGE (413).
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) string {
	var (
		he     *httpError
		mbe    *http.MaxBytesError
		status int
		body   errorBody
	)
	switch {
	case errors.As(err, &he):
		status = he.status
		body.Error = errorDetail{Code: he.code, Message: he.message}
	case errors.As(err, &mbe):
		status = http.StatusRequestEntityTooLarge
		body.Error = errorDetail{Code: protocol.ErrFrameTooLarge.Name,
			Message: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
	default:
		pe := errmap.ErrorFrom(err)
		status = statusForCode(pe.Code)
		name := pe.Name
		if name == "" {
			name = "CODE_" + strconv.Itoa(int(pe.Code))
		}
		body.Error = errorDetail{Code: name, Message: pe.Message, Retryable: pe.Retryable}
		if pe.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int((pe.RetryAfter+time.Second-1)/time.Second)))
		}
	}
	if status >= 500 {
		// The full error, with the file paths and hosts the response leaves out.
		h.logger.WarnContext(r.Context(), "http request failed", slog.String("method", r.Method),
			slog.String("path", r.URL.Path), slog.Int("status", status), slog.String("code", body.Error.Code),
			slog.Any("error", err))
	}
	writeJSON(w, status, body)
	return body.Error.Code
}

// writeJSON writes v as the JSON response body with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // the client may be gone; nothing to do about it
}

// invalidf returns an error wrapping storage.ErrInvalidArgument (400 INVALID_ARGUMENT).
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", storage.ErrInvalidArgument, fmt.Sprintf(format, args...))
}
