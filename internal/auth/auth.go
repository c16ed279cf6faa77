// Package auth authenticates clients and authorizes their requests: named principals, each with a
// token (kept in the configuration as a salted hash) or a client certificate common name, and
// permissions to publish, consume and administer topics named by wildcard patterns. Its functions
// are pure: the TCP server and the HTTP admin API call them, and log and count denials.
package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spoolmq/spool/internal/names"
)

// Actions of a permission.
const (
	Publish = "publish"
	Consume = "consume"
	Admin   = "admin"
	// Priority exempts the principal's publishes to the matching topics from backpressure (a
	// topic's backlog bound). It does not allow publishing: that needs publish too.
	Priority = "priority"
)

// Reasons of a denial: the reason label of spool_auth_denied_total.
const (
	// ReasonUnauthenticated: no credential, or one that names no principal.
	ReasonUnauthenticated = "unauthenticated"
	// ReasonForbidden: a principal without the permission.
	ReasonForbidden = "forbidden"
)

// MinTokenLength is the shortest token HashToken accepts: tokens are random secrets, not
// passwords (see HashToken).
const MinTokenLength = 16

// Config is the "auth" section of the configuration file. With no principals, authentication is
// off: every client may do everything.
type Config struct {
	// Principals are the clients that may connect.
	Principals []Principal `yaml:"principals"`
	// OpenMetrics keeps GET /metrics open to unauthenticated scrapers. Defaults to true; false
	// needs a principal with an admin permission on "#". /healthz and /readyz are always open.
	OpenMetrics bool `yaml:"open_metrics"`
}

// Principal is a named client.
type Principal struct {
	// Name identifies the principal in logs. Required and unique.
	Name string `yaml:"name"`
	// TokenHash is the hash of the principal's token, as printed by `spool token hash`.
	TokenHash string `yaml:"token_hash"`
	// CertCN is the subject common name of the principal's client certificate (mutual TLS).
	CertCN string `yaml:"cert_cn"`
	// Permissions are what the principal may do; nothing else is allowed.
	Permissions []Permission `yaml:"permissions"`

	// salt and sum are TokenHash parsed, by New: ByToken runs on every connection and HTTP
	// request, and checks every principal.
	salt, sum []byte
}

// Permission allows one action on the topics matching a pattern.
type Permission struct {
	// Action is publish, consume, admin or priority.
	Action string `yaml:"action"`
	// Topics is a topic name or wildcard pattern ("orders.#", "orders.*.created").
	Topics string `yaml:"topics"`
	// Groups restricts consume to the consumer groups matching this glob ("billing-*": '*' is any
	// run of characters). Empty: any group, and consuming without a group.
	Groups string `yaml:"groups"`
}

// Enabled reports whether authentication is on.
func (c Config) Enabled() bool { return len(c.Principals) > 0 }

// Validate reports the first invalid principal or permission; the key names it
// ("principals[1].permissions[0].topics").
func (c Config) Validate() (key string, err error) {
	seen := make(map[string]bool)
	cns := make(map[string]bool)
	for i, p := range c.Principals {
		k := fmt.Sprintf("principals[%d]", i)
		switch {
		case p.Name == "":
			return k + ".name", errors.New("must not be empty")
		case seen[p.Name]:
			return k + ".name", fmt.Errorf("%q names two principals", p.Name)
		case p.TokenHash == "" && p.CertCN == "":
			return k, fmt.Errorf("principal %q needs a token_hash or a cert_cn", p.Name)
		case p.CertCN != "" && cns[p.CertCN]:
			return k + ".cert_cn", fmt.Errorf("%q names two principals", p.CertCN)
		}
		seen[p.Name] = true
		if p.CertCN != "" {
			cns[p.CertCN] = true
		}
		if p.TokenHash != "" {
			if _, _, err := parseHash(p.TokenHash); err != nil {
				return k + ".token_hash", err
			}
		}
		for j, perm := range p.Permissions {
			pk := fmt.Sprintf("%s.permissions[%d]", k, j)
			switch perm.Action {
			case Publish, Consume, Admin, Priority:
			default:
				return pk + ".action", fmt.Errorf("must be publish, consume, admin or priority, got %q", perm.Action)
			}
			if err := names.ValidatePattern(perm.Topics); err != nil {
				return pk + ".topics", err
			}
			if perm.Groups != "" && perm.Action != Consume {
				return pk + ".groups", fmt.Errorf("applies to consume only, not %s", perm.Action)
			}
		}
	}
	return "", nil
}

// hashScheme prefixes a token hash.
const hashScheme = "sha256"

// HashToken returns the hash of token to put in the configuration:
// "sha256:<salt>:<digest>", where salt is 16 random bytes and digest is SHA-256(salt || token),
// both in hex. A plain salted SHA-256 and not a slow password hash (bcrypt, argon2): tokens are
// random secrets of at least MinTokenLength characters (openssl rand -hex 32), which no dictionary
// guesses, and every connection and HTTP request checks one, which a slow hash would make costly.
// The salt keeps equal tokens from having equal hashes.
func HashToken(token string) (string, error) {
	if len(token) < MinTokenLength {
		return "", fmt.Errorf("token too short: %d characters, want at least %d random ones (openssl rand -hex 32)", len(token), MinTokenLength)
	}
	salt := make([]byte, 16)
	_, _ = rand.Read(salt) // never fails (crypto/rand)
	return hashScheme + ":" + hex.EncodeToString(salt) + ":" + hex.EncodeToString(digest(salt, token)), nil
}

func digest(salt []byte, token string) []byte {
	h := sha256.New()
	h.Write(salt)
	h.Write([]byte(token))
	return h.Sum(nil)
}

// parseHash splits a token hash into its salt and digest.
func parseHash(s string) (salt, sum []byte, err error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 || parts[0] != hashScheme {
		return nil, nil, errors.New("must be sha256:<salt>:<digest>, as printed by spool token hash")
	}
	salt, err1 := hex.DecodeString(parts[1])
	sum, err2 := hex.DecodeString(parts[2])
	if err1 != nil || err2 != nil || len(salt) == 0 || len(sum) != sha256.Size {
		return nil, nil, errors.New("must be sha256:<salt>:<digest> in hex, as printed by spool token hash")
	}
	return salt, sum, nil
}

// CheckToken reports whether token is the one hash was made of, in constant time.
func CheckToken(hash, token string) bool {
	salt, sum, err := parseHash(hash)
	if err != nil {
		return false
	}
	return checkDigest(salt, sum, token)
}

func checkDigest(salt, sum []byte, token string) bool {
	return subtle.ConstantTimeCompare(digest(salt, token), sum) == 1
}

// DenialLogInterval is the shortest time between two logged denials of one reason and principal
// (LogDenial).
const DenialLogInterval = 10 * time.Second

// Authorizer answers who a credential names and what a principal may do. Nil means
// authentication is off: every method allows everything.
type Authorizer struct {
	principals  []*Principal
	byCN        map[string]*Principal
	openMetrics bool

	// denials are LogDenial's state per reason and principal: a few keys (two reasons, the
	// configured principals and "").
	mu      sync.Mutex
	denials map[denialKey]*denialState
}

type denialKey struct{ reason, principal string }

type denialState struct {
	logged     time.Time // when the last logged denial was
	suppressed uint64    // denials not logged since
}

// LogDenial reports whether a denial of reason for principal ("" when unauthenticated) at now is
// to be logged, and how many of the same reason and principal were not logged since the last one
// that was. One per DenialLogInterval is: a client retrying a bad token in a loop would flood the
// log otherwise (spool_auth_denied_total counts them all). Shared by the TCP and HTTP listeners.
func (a *Authorizer) LogDenial(reason, principal string, now time.Time) (log bool, suppressed uint64) {
	if a == nil {
		return true, 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	k := denialKey{reason, principal}
	st := a.denials[k]
	if st == nil {
		st = &denialState{}
		a.denials[k] = st
	} else if now.Sub(st.logged) < DenialLogInterval {
		st.suppressed++
		return false, 0
	}
	suppressed = st.suppressed
	st.logged, st.suppressed = now, 0
	return true, suppressed
}

// New returns the authorizer of cfg, or nil when cfg has no principals. cfg must be valid.
func New(cfg Config) (*Authorizer, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	if key, err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("auth: %s: %w", key, err)
	}
	a := &Authorizer{byCN: make(map[string]*Principal), openMetrics: cfg.OpenMetrics, denials: make(map[denialKey]*denialState)}
	for i := range cfg.Principals {
		p := cfg.Principals[i]
		if p.TokenHash != "" {
			p.salt, p.sum, _ = parseHash(p.TokenHash) // valid: checked by Validate
		}
		a.principals = append(a.principals, &p)
		if p.CertCN != "" {
			a.byCN[p.CertCN] = &p
		}
	}
	return a, nil
}

// Enabled reports whether authentication is on.
func (a *Authorizer) Enabled() bool { return a != nil }

// OpenMetrics reports whether /metrics is open without credentials.
func (a *Authorizer) OpenMetrics() bool { return a == nil || a.openMetrics }

// ByToken returns the principal whose token is token. Every principal's hash is checked, so the
// time taken does not tell which one matched.
func (a *Authorizer) ByToken(token string) (*Principal, bool) {
	if token == "" {
		return nil, false
	}
	var found *Principal
	for _, p := range a.principals {
		if p.sum != nil && checkDigest(p.salt, p.sum, token) && found == nil {
			found = p
		}
	}
	return found, found != nil
}

// ByCertCN returns the principal of a verified client certificate's subject common name.
func (a *Authorizer) ByCertCN(cn string) (*Principal, bool) {
	if cn == "" {
		return nil, false
	}
	p, ok := a.byCN[cn]
	return p, ok
}

// Can reports whether p may do action on topic (a topic name). A nil principal may do nothing.
func (p *Principal) Can(action, topic string) bool {
	if p == nil {
		return false
	}
	for _, perm := range p.Permissions {
		if perm.Action == action && names.Match(perm.Topics, topic) {
			return true
		}
	}
	return false
}

// CanAny reports whether p may do action on some topic.
func (p *Principal) CanAny(action string) bool {
	if p == nil {
		return false
	}
	for _, perm := range p.Permissions {
		if perm.Action == action {
			return true
		}
	}
	return false
}

// CanConsume reports whether p may consume topic in group ("" for no group).
func (p *Principal) CanConsume(topic, group string) bool {
	if p == nil {
		return false
	}
	for _, perm := range p.Permissions {
		if perm.Action == Consume && names.Match(perm.Topics, topic) && groupMatch(perm.Groups, group) {
			return true
		}
	}
	return false
}

// CanConsumePattern reports whether one consume permission of p admitting group covers every
// topic pattern matches (Covers). A durable group's wildcard subscription needs it: its binding
// makes every matching topic created later get a subscription for the group, which would hold
// the retention of topics the principal may not consume.
func (p *Principal) CanConsumePattern(pattern, group string) bool {
	if p == nil {
		return false
	}
	for _, perm := range p.Permissions {
		if perm.Action == Consume && groupMatch(perm.Groups, group) && Covers(perm.Topics, pattern) {
			return true
		}
	}
	return false
}

// Covers reports whether every topic that pattern matches also matches perm (both valid
// patterns): segment by segment, a final '#' of perm covers anything left, a '*' of perm covers
// one segment ('*' or a name, not '#', which may stand for several), a name covers the same name.
func Covers(perm, pattern string) bool {
	if pattern == "#" {
		// Every topic (one segment at least, topics are never empty): "*.#" covers it too.
		return perm == "#" || perm == "*.#"
	}
	for {
		qseg, qrest, qmore := strings.Cut(perm, ".")
		if qseg == "#" && !qmore {
			return true
		}
		pseg, prest, pmore := strings.Cut(pattern, ".")
		if pseg == "#" {
			return false // '#' of pattern matches any number of segments; perm has no final '#' here
		}
		if qseg != "*" && qseg != pseg {
			return false
		}
		switch {
		case !qmore && !pmore:
			return true
		case !pmore:
			return qrest == "#" // pattern ended: only a final '#' (zero segments) of perm remains
		case !qmore:
			return false
		}
		perm, pattern = qrest, prest
	}
}

// MayConsumeGroup reports whether some consume permission of p admits group: a wildcard
// subscription without a group needs one, and then binds only the topics CanConsume allows.
func (p *Principal) MayConsumeGroup(group string) bool {
	if p == nil {
		return false
	}
	for _, perm := range p.Permissions {
		if perm.Action == Consume && groupMatch(perm.Groups, group) {
			return true
		}
	}
	return false
}

// CanAdminAll reports whether p has admin on every topic (a permission on "#"): the admin
// requests that name no topic (listings of every topic, bindings, members) need it.
func (p *Principal) CanAdminAll() bool {
	if p == nil {
		return false
	}
	for _, perm := range p.Permissions {
		if perm.Action == Admin && perm.Topics == "#" {
			return true
		}
	}
	return false
}

// groupMatch reports whether group matches glob: empty glob matches any group and none; '*'
// matches any run of characters.
func groupMatch(glob, group string) bool {
	if glob == "" {
		return true
	}
	parts := strings.Split(glob, "*")
	if len(parts) == 1 {
		return glob == group
	}
	if !strings.HasPrefix(group, parts[0]) {
		return false
	}
	rest := group[len(parts[0]):]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, mid)
		if i < 0 {
			return false
		}
		rest = rest[i+len(mid):]
	}
	return strings.HasSuffix(rest, parts[len(parts)-1])
}
