package admin

import (
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	api "github.com/spoolmq/spool/client/admin"
	"github.com/spoolmq/spool/internal/storage"
)

// buildOpenAPI builds the OpenAPI 3.0 document of routes. Paths, methods, parameters and
// descriptions come from the route table; request and response schemas are generated from the Go
// types the handlers encode and decode (json tags, embedded structs inlined like encoding/json
// does), so the document cannot drift from the JSON the API speaks.
func buildOpenAPI(routes []*route) map[string]any {
	g := &schemaGen{comps: make(map[string]any), names: make(map[string]reflect.Type)}
	errRef := g.schema(reflect.TypeFor[errorBody]())
	paths := make(map[string]any)
	tags := []string{}
	for _, rt := range routes {
		item, _ := paths[rt.path].(map[string]any)
		if item == nil {
			item = make(map[string]any)
			paths[rt.path] = item
		}
		d := rt.doc
		if !slices.Contains(tags, d.tag) {
			tags = append(tags, d.tag)
		}
		op := map[string]any{
			"operationId": d.id,
			"summary":     d.summary,
			"tags":        []string{d.tag},
		}
		if d.desc != "" {
			op["description"] = d.desc
		}
		var params []any
		for _, name := range pathParams(rt.path) {
			params = append(params, map[string]any{
				"name": name, "in": "path", "required": true, "schema": map[string]any{"type": "string"},
			})
		}
		for _, q := range d.query {
			params = append(params, map[string]any{
				"name": q.name, "in": "query", "required": false, "description": q.desc,
				"schema": map[string]any{"type": q.typ},
			})
		}
		if len(params) > 0 {
			op["parameters"] = params
		}
		if d.body != nil {
			content := map[string]any{"application/json": map[string]any{"schema": g.schema(d.body)}}
			if d.rawBody {
				raw := map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}
				content["application/octet-stream"] = raw
				content["text/plain"] = raw
			}
			op["requestBody"] = map[string]any{"required": !d.bodyOptional, "content": content}
		}
		responses := make(map[string]any)
		okResp := map[string]any{"description": http.StatusText(d.ok)}
		switch {
		case d.resp != nil:
			okResp["content"] = map[string]any{"application/json": map[string]any{"schema": g.schema(d.resp)}}
		case d.contentType == "text/plain":
			okResp["content"] = map[string]any{"text/plain": map[string]any{"schema": map[string]any{"type": "string"}}}
		case d.contentType != "":
			okResp["content"] = map[string]any{d.contentType: map[string]any{"schema": map[string]any{"type": "object"}}}
		}
		responses[strconv.Itoa(d.ok)] = okResp
		// 421: without authentication, a Host that names no address of this broker (DNS
		// rebinding; Handler.ServeHTTP).
		errs := append(append([]int(nil), d.errs...), http.StatusInternalServerError, http.StatusMisdirectedRequest)
		if d.body != nil {
			errs = append(errs, http.StatusRequestEntityTooLarge)
		}
		if routeAccess(rt) != accessOpen {
			// With authentication configured (auth.principals); /metrics only without open_metrics.
			op["security"] = []any{map[string]any{"bearer": []string{}}}
			errs = append(errs, http.StatusUnauthorized)
			if !slices.Contains(errs, http.StatusForbidden) {
				errs = append(errs, http.StatusForbidden)
			}
		}
		for _, s := range errs {
			responses[strconv.Itoa(s)] = map[string]any{
				"description": http.StatusText(s),
				"content":     map[string]any{"application/json": map[string]any{"schema": errRef}},
			}
		}
		op["responses"] = responses
		item[strings.ToLower(rt.method)] = op
	}
	tagList := make([]any, len(tags))
	for i, t := range tags {
		tagList[i] = map[string]any{"name": t}
	}
	return map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{
			"title":   "Spool admin API",
			"version": "v1",
			"description": "HTTP API of the Spool message broker: topics, consumer groups (subscriptions), dead-letter queues, " +
				"publish and pull-consume over HTTP, probes and Prometheus metrics. Errors are " +
				"{\"error\":{\"code\",\"message\",\"retryable\"}} with the codes of the wire protocol (docs/protocol.md section 9.2) " +
				"plus NOT_FOUND and METHOD_NOT_ALLOWED.",
		},
		"tags":  tagList,
		"paths": paths,
		"components": map[string]any{"schemas": g.comps, "securitySchemes": map[string]any{
			"bearer": map[string]any{"type": "http", "scheme": "bearer",
				"description": "A principal's token, when the broker has authentication (auth.principals; docs/protocol.md section 5.1.1). A client certificate naming a principal (mutual TLS) also works."},
		}},
	}
}

// pathParams returns the {names} of a path pattern in order.
func pathParams(path string) []string {
	var out []string
	for seg := range strings.SplitSeq(path, "/") {
		if strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") && seg != "{$}" {
			out = append(out, strings.TrimSuffix(seg[1:len(seg)-1], "..."))
		}
	}
	return out
}

// schemaGen generates OpenAPI schemas from Go types. Named struct types become components.
type schemaGen struct {
	comps map[string]any
	names map[string]reflect.Type
}

var (
	timeType     = reflect.TypeFor[time.Time]()
	durationType = reflect.TypeFor[Duration]()
	bytesType    = reflect.TypeFor[[]byte]()

	// componentNames overrides the component name of a few types: Member kept the name of
	// broker.MemberInfo, which the API wrote before package client/admin had its own type.
	componentNames = map[reflect.Type]string{
		reflect.TypeFor[errorBody]():   "Error",
		reflect.TypeFor[errorDetail](): "ErrorDetail",
		reflect.TypeFor[Member]():      "MemberInfo",
	}

	// schemaAs documents an engine type that the API writes as is under the component of its
	// client/admin twin, which has the same JSON (one StartPosition in the document).
	schemaAs = map[reflect.Type]reflect.Type{
		reflect.TypeFor[storage.StartPosition](): reflect.TypeFor[api.StartPosition](),
	}

	enums = map[reflect.Type][]string{
		reflect.TypeFor[storage.Semantics]():          {string(storage.Queue), string(storage.PubSub)},
		reflect.TypeFor[storage.CompletionTracking](): {string(storage.Watermark), string(storage.Refcount)},
		reflect.TypeFor[storage.CompletionState](): {string(storage.CompletionPending), string(storage.CompletionAcked),
			string(storage.CompletionDeadLettered), string(storage.CompletionRemoved)},
		reflect.TypeFor[storage.SubscriptionState](): {string(storage.Active), string(storage.Paused), string(storage.Dead),
			string(storage.Cancelled), string(storage.Deleted)},
		reflect.TypeFor[storage.StartKind](): {string(storage.FromNow), string(storage.FromBeginning),
			string(storage.FromTimestamp), string(storage.FromMessageID)},
		reflect.TypeFor[storage.DLQReason](): {string(storage.DLQMaxDeliveries), string(storage.DLQRejected)},

		// The same enums in the types of client/admin (TestPublicEnums keeps them equal).
		reflect.TypeFor[api.Semantics]():          {string(api.Queue), string(api.PubSub)},
		reflect.TypeFor[api.CompletionTracking](): {string(api.Watermark), string(api.Refcount)},
		reflect.TypeFor[api.CompletionState](): {string(api.CompletionPending), string(api.CompletionAcked),
			string(api.CompletionDeadLettered), string(api.CompletionRemoved)},
		reflect.TypeFor[api.SubscriptionState](): {string(api.Active), string(api.Paused), string(api.Dead),
			string(api.Cancelled), string(api.Deleted)},
		reflect.TypeFor[api.StartKind](): {string(api.FromNow), string(api.FromBeginning),
			string(api.FromTimestamp), string(api.FromMessageID)},
	}
)

func (g *schemaGen) schema(t reflect.Type) map[string]any {
	if as, ok := schemaAs[t]; ok {
		t = as
	}
	switch t {
	case timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case bytesType:
		return map[string]any{"type": "string", "format": "byte"}
	case durationType:
		if _, ok := g.comps["Duration"]; !ok {
			g.comps["Duration"] = map[string]any{
				"description": "A duration: a Go duration string (\"30s\", \"1h30m\"; always this form in responses) or a number of milliseconds.",
				"oneOf": []any{
					map[string]any{"type": "string", "example": "30s"},
					map[string]any{"type": "number"},
				},
			}
		}
		return map[string]any{"$ref": "#/components/schemas/Duration"}
	}
	if vals, ok := enums[t]; ok {
		return map[string]any{"type": "string", "enum": vals}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return g.schema(t.Elem())
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Uint8, reflect.Uint16:
		return map[string]any{"type": "integer", "format": "int32"}
	case reflect.Int, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer", "format": "int64"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": g.schema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem())}
	case reflect.Struct:
		return g.ref(t)
	}
	return map[string]any{}
}

// ref returns a reference to the component of struct type t, generating it on first use.
func (g *schemaGen) ref(t reflect.Type) map[string]any {
	name, ok := componentNames[t]
	if !ok {
		name = t.Name()
	}
	if other, ok := g.names[name]; ok && other != t {
		name = pkgName(t) + name
	}
	if _, ok := g.names[name]; !ok {
		g.names[name] = t
		g.comps[name] = map[string]any{} // placeholder for recursive types
		props := make(map[string]any)
		g.fields(t, props)
		g.comps[name] = map[string]any{"type": "object", "properties": props}
	}
	return map[string]any{"$ref": "#/components/schemas/" + name}
}

func pkgName(t reflect.Type) string {
	p := t.PkgPath()
	if i := strings.LastIndex(p, "/"); i >= 0 {
		p = p[i+1:]
	}
	if p == "" {
		return ""
	}
	return strings.ToUpper(p[:1]) + p[1:]
}

// fields adds the JSON properties of struct t to props the way encoding/json sees them.
func (g *schemaGen) fields(t reflect.Type, props map[string]any) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				g.fields(ft, props)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = g.schema(f.Type)
	}
}
