package e2e

import (
	"strings"
	"testing"
)

// TestFilterBinary: with the real binary, on the embedded engine and on PostgreSQL, a text-mode
// member with a filter (as nc would send it) gets only the matching messages that spool pub sends
// with headers; what it does not match is completed for its group (spool group describe:
// nothing pending).
func TestFilterBinary(t *testing.T) {
	t.Parallel()
	wal := newBroker(t)
	pg := newPGBroker(t, pgURL(t), freshSchema(t, pgURL(t)))
	for name, b := range map[string]*broker{"embedded": wal, "postgresql": pg} {
		b.start()
		b.createTopic("ev", map[string]any{"semantics": "PUB_SUB"})
		c := b.dialText()
		c.echo("JOIN_GROUP g eu-1")
		c.expect("OK group g consumer eu-1")
		c.echo("SUBSCRIBE ev FILTER region in (eu, uk)")
		c.expect("OK subscribed ev group g consumer eu-1")
		for _, r := range []string{"us", "eu", "ap", "uk"} {
			if _, errOut, code := runSpool(t, b, "", "pub", "--header", "region="+r, "ev", "to-"+r); code != 0 {
				t.Fatalf("%s: pub: exit %d: %s", name, code, errOut)
			}
		}
		c.expect("MESSAGE ev to-eu")
		c.expect("MESSAGE ev to-uk")
		c.echo("ACK 1 2")
		c.expect("OK 2 acked")
		out, errOut, code := runSpool(t, b, "", "group", "describe", "ev", "g", "--json")
		if code != 0 || !strings.Contains(out, `"pending":0`) || !strings.Contains(out, `"filter":"region in (eu, uk)"`) {
			t.Fatalf("%s: group describe: exit %d, %q, %q", name, code, out, errOut)
		}
	}
}
