// Package cli holds the parts of the spool command-line client (cmd/spool: pub, sub, topic, group,
// dlq) that are not commands: the CLI side of the HTTP admin API client and the rendering of
// tables, fields and values for humans and of JSON lines for scripts.
//
//   - AdminClient is the public admin client (package client/admin) with the CLI's hint at
//     --http on a transport failure. Call returns the raw body of a 2xx answer (so that --json
//     can print exactly what the API said); any other answer returns an *APIError carrying the
//     API's error code ("spool: TOPIC_NOT_FOUND: ..." on the terminal).
//   - Table renders aligned columns with text/tabwriter; Fields renders "Name: value" blocks.
//     Both sanitize cells (tabs, newlines and other control characters would break the layout).
//   - Bytes, Duration, Time, Text and Truncate format values for those tables; Payload renders a
//     message body as text or base64 in the same shape as the admin API's messages.
//   - JSONLines writes one JSON object per line, without HTML escaping.
//
// Nothing here keeps state between calls; the types are safe for concurrent use where their doc
// says so. Nothing here prints on its own: every writer is passed in.
package cli
