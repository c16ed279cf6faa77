package storage

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestMessageRetentionFollowsMaxRetention: a max_retention below the 24 h default of
// message_retention takes the defaulted (or stored default) message_retention down with it,
// while an explicit message_retention above max_retention is still refused.
func TestMessageRetentionFollowsMaxRetention(t *testing.T) {
	for _, c := range []struct {
		name      string
		cfg       TopicConfig
		want      time.Duration // message_retention after WithDefaults
		wantError string
	}{
		{"defaulted, max below it", TopicConfig{MaxRetention: 12 * time.Hour}, 12 * time.Hour, ""},
		{"default value read back by an update", TopicConfig{MessageRetention: DefaultMessageRetention, MaxRetention: time.Hour}, time.Hour, ""},
		{"defaulted, max above it", TopicConfig{MaxRetention: 48 * time.Hour}, DefaultMessageRetention, ""},
		{"defaulted, max defaulted", TopicConfig{}, DefaultMessageRetention, ""},
		{"explicit, below max", TopicConfig{MessageRetention: time.Hour, MaxRetention: 12 * time.Hour}, time.Hour, ""},
		{"explicit, above max", TopicConfig{MessageRetention: 13 * time.Hour, MaxRetention: 12 * time.Hour}, 13 * time.Hour,
			"message_retention (13h0m0s) must not exceed max_retention (12h0m0s)"},
		{"defaulted, max invalid", TopicConfig{MaxRetention: -time.Hour}, DefaultMessageRetention, "max_retention must be at least 1s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := c.cfg.WithDefaults()
			if got.MessageRetention != c.want {
				t.Errorf("message_retention %s, want %s", got.MessageRetention, c.want)
			}
			if again := got.WithDefaults(); again != got {
				t.Errorf("WithDefaults is not idempotent: %+v, then %+v", got, again)
			}
			err := got.Validate()
			switch {
			case c.wantError == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case c.wantError != "" && (!errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.wantError)):
				t.Errorf("Validate: %v, want an invalid argument with %q", err, c.wantError)
			}
		})
	}
}
