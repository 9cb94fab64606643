// Package yamlcheck decodes YAML into Go types strictly, naming the field
// path and line of every problem: unknown fields, wrong types and values a
// field's own JSON decoder rejects. Config files and manifests go through it
// so a user learns exactly where their file is wrong.
package yamlcheck

import (
	"bytes"
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"

	yaml11 "go.yaml.in/yaml/v2"
	yaml "go.yaml.in/yaml/v3"
)

// FieldError is one problem at one place in a document.
type FieldError struct {
	Path string // dotted field path, e.g. spec.containers[0].image
	Line int    // 1-based line in the file, 0 if unknown
	Msg  string
}

func (e *FieldError) Error() string {
	where := e.Path
	if where == "" {
		where = "(document)"
	}
	if e.Line > 0 {
		return fmt.Sprintf("%s: %s (line %d)", where, e.Msg, e.Line)
	}
	return fmt.Sprintf("%s: %s", where, e.Msg)
}

// Documents splits data into its YAML documents, skipping empty ones. A
// syntax error is returned with its line.
func Documents(data []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "yaml: "))
		}
		if len(n.Content) == 0 || (n.Content[0].Kind == yaml.ScalarNode && n.Content[0].Tag == "!!null") {
			continue
		}
		docs = append(docs, &n)
	}
}

// Decode checks doc against out's type and, when it is clean, decodes it
// into out through encoding/json, so json tags and custom JSON decoders
// apply. Fields missing from doc keep the values out already has. All
// problems found are returned, joined.
func Decode(doc *yaml.Node, out any) error {
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	rv := reflect.ValueOf(out)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errors.New("yamlcheck: Decode needs a non-nil pointer")
	}
	st := &state{budget: maxNodes}
	check(doc, rv.Type().Elem(), "", st)
	if len(st.errs) > 0 {
		return errors.Join(st.errs...)
	}
	js, err := toJSON(doc)
	if err != nil {
		return &FieldError{Line: doc.Line, Msg: err.Error()}
	}
	if err := json.Unmarshal(js, out); err != nil {
		return &FieldError{Line: doc.Line, Msg: err.Error()}
	}
	return nil
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// maxNodes bounds the nodes one document may expand to through aliases,
// so a "billion laughs" document is refused instead of exhausting memory.
const maxNodes = 100_000

type state struct {
	errs   []error
	budget int
}

func check(n *yaml.Node, t reflect.Type, path string, st *state) {
	errs := &st.errs
	fail := func(n *yaml.Node, format string, args ...any) {
		*errs = append(*errs, &FieldError{Path: path, Line: n.Line, Msg: fmt.Sprintf(format, args...)})
	}
	if st.budget--; st.budget == 0 {
		fail(n, "document expands to more than %d nodes", maxNodes)
	}
	if st.budget <= 0 {
		return
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if msg := yaml11Differs(n); msg != "" {
		fail(n, "%s", msg)
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	// A type with its own decoder is checked by running that decoder on
	// this node alone, so its error carries the path.
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
		js, err := toJSON(n)
		if err != nil {
			fail(n, "%v", err)
			return
		}
		if err := json.Unmarshal(js, reflect.New(t).Interface()); err != nil {
			fail(n, "%s", cleanJSONError(err, n))
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		check(n, t.Elem(), path, st)
	case reflect.Interface:
		// Anything goes.
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			fail(n, "want a mapping, got %s", describe(n))
			return
		}
		fields := structFields(t)
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			name := k.Value
			if seen[name] {
				*errs = append(*errs, &FieldError{Path: join(path, name), Line: k.Line, Msg: "duplicate field"})
				continue
			}
			seen[name] = true
			ft, ok := fields[name]
			if !ok {
				*errs = append(*errs, &FieldError{Path: join(path, name), Line: k.Line, Msg: "unknown field"})
				continue
			}
			check(v, ft, join(path, name), st)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			fail(n, "want a mapping, got %s", describe(n))
			return
		}
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				*errs = append(*errs, &FieldError{Path: path, Line: k.Line, Msg: "map key must be a scalar"})
				continue
			}
			if msg := yaml11Differs(k); msg != "" {
				*errs = append(*errs, &FieldError{Path: join(path, k.Value), Line: k.Line, Msg: "key " + msg})
				continue
			}
			if k.Tag != "!!str" {
				// kubectl would make a string of it, and 0 and 00 the
				// same key.
				*errs = append(*errs, &FieldError{Path: join(path, k.Value), Line: k.Line, Msg: fmt.Sprintf("want a string key, got %s (quote it)", describe(k))})
				continue
			}
			if line, dup := first[k.Value]; dup {
				*errs = append(*errs, &FieldError{Path: join(path, k.Value), Line: k.Line, Msg: fmt.Sprintf("duplicate key (first at line %d)", line)})
				continue
			}
			first[k.Value] = k.Line
			check(v, t.Elem(), join(path, k.Value), st)
		}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 && n.Kind == yaml.ScalarNode {
			// []byte is base64 text in JSON, decoded as encoding/json
			// does. The messages do not repeat the value: it is often a
			// secret.
			switch {
			case n.Tag == "!!binary":
				fail(n, "the !!binary tag is not supported; write the base64 text untagged")
			case n.Tag != "!!str":
				fail(n, "want base64 text, got a YAML %s (quote it)", strings.TrimPrefix(n.Tag, "!!"))
			default:
				if _, err := base64.StdEncoding.DecodeString(n.Value); err != nil {
					fail(n, "want base64 text: %v", err)
				}
			}
			return
		}
		if n.Kind != yaml.SequenceNode {
			fail(n, "want a list, got %s", describe(n))
			return
		}
		for i, item := range n.Content {
			check(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), st)
		}
	case reflect.String:
		switch {
		case n.Kind != yaml.ScalarNode:
			fail(n, "want a string, got %s", describe(n))
		case n.Tag != "!!str":
			fail(n, "want a string, got %s (quote it)", describe(n))
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			fail(n, "want true or false, got %s", describe(n))
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			fail(n, "want an integer, got %s", describe(n))
			return
		}
		js, _ := toJSON(n)
		if err := json.Unmarshal(js, reflect.New(t).Interface()); err != nil {
			fail(n, "%s is out of range for %s", n.Value, t.Kind())
		}
	case reflect.Float32, reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
			fail(n, "want a number, got %s", describe(n))
		}
	}
}

// yaml11Differs says why a plain scalar means one thing here (YAML 1.2)
// and another to kubectl and the API machinery, which read YAML 1.1
// (sigs.k8s.io/yaml): `yes`, `on`, `Y` are booleans there, 0777 is
// octal, 1_000 a number. Such a scalar must be quoted, so a file means
// the same to outpost as to kubectl. "" when it means the same.
func yaml11Differs(n *yaml.Node) string {
	if n.Kind != yaml.ScalarNode || n.Style&(yaml.TaggedStyle|yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 || n.Value == "" {
		return ""
	}
	if plainWord(n.Value) {
		return ""
	}
	var ours any
	if n.Decode(&ours) != nil {
		return ""
	}
	var doc map[string]any
	if yaml11.Unmarshal([]byte("v: "+n.Value+"\n"), &doc) != nil {
		return ""
	}
	theirs, ok := doc["v"]
	if !ok {
		return ""
	}
	if reflect.DeepEqual(ours, theirs) || fmt.Sprint(ours) == fmt.Sprint(theirs) && reflect.TypeOf(ours) == reflect.TypeOf(theirs) {
		return ""
	}
	// The value is not repeated: it may be a secret.
	return fmt.Sprintf("means a %s to kubectl, which reads YAML 1.1, and a %s here: quote it", kindOf(theirs), kindOf(ours))
}

// plainWord reports whether s is a string to YAML 1.1 and 1.2 alike
// without decoding it both ways, which is most of a manifest's scalars
// (field names, names, images): ASCII letters, with '-', '_', '/' and
// '.' after the first, and not one of YAML 1.1's boolean or null words.
// Every other implicit type of YAML 1.1 (numbers, octals, sexagesimals,
// timestamps, .inf and .nan, the merge and value keys) needs a digit or
// begins with another character.
func plainWord(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && (c == '-' || c == '_' || c == '/' || c == '.'):
		default:
			return false
		}
	}
	return !yaml11Words[s]
}

// yaml11Words are the letter-only scalars YAML 1.1 reads as a boolean or
// null (yaml.v2's resolve table).
var yaml11Words = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true,
	"n": true, "N": true, "no": true, "No": true, "NO": true,
	"true": true, "True": true, "TRUE": true, "false": true, "False": true, "FALSE": true,
	"on": true, "On": true, "ON": true, "off": true, "Off": true, "OFF": true,
	"null": true, "Null": true, "NULL": true,
}

// kindOf names the YAML type of a decoded scalar.
func kindOf(v any) string {
	switch v.(type) {
	case bool:
		return "boolean"
	case int, int64, uint64:
		return "integer"
	case float64:
		return "number"
	case string:
		return "string"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.Tag {
	case "!!int", "!!float":
		return "number " + n.Value
	case "!!bool":
		return "boolean " + n.Value
	}
	return fmt.Sprintf("%q", n.Value)
}

// fieldsOf caches structFields by type: a manifest's Pod has some forty
// struct types, each met again in every file.
var fieldsOf sync.Map // reflect.Type → map[string]reflect.Type, read only

// structFields maps JSON names to field types, flattening embedded and
// inline structs as encoding/json does. The map is shared: read only.
func structFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldsOf.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := structFieldsOf(t)
	fieldsOf.Store(t, m)
	return m
}

func structFieldsOf(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" && opts == "" {
			continue
		}
		inline := strings.Contains(","+opts+",", ",inline,")
		if (f.Anonymous && name == "") || inline {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range structFieldsOf(ft) {
					if _, ok := out[k]; !ok {
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

// toJSON renders a YAML node as JSON.
func toJSON(n *yaml.Node) ([]byte, error) {
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, err
	}
	v, err := jsonable(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// jsonable turns the map[any]any that YAML allows into JSON's string keys.
func jsonable(v any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			j, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			x[k] = j
		}
		return x, nil
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			j, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			m[fmt.Sprint(k)] = j
		}
		return m, nil
	case []any:
		for i, e := range x {
			j, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			x[i] = j
		}
		return x, nil
	}
	return v, nil
}

func cleanJSONError(err error, n *yaml.Node) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "json: ")
	if strings.HasPrefix(msg, "cannot unmarshal") {
		return fmt.Sprintf("invalid value %s", describe(n))
	}
	return fmt.Sprintf("invalid value %s: %s", describe(n), msg)
}

// Line returns the line of the node at a field path such as
// spec.containers[0].image within doc, or of its nearest existing parent;
// 0 if doc has no lines.
func Line(doc *yaml.Node, path string) int {
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	line := n.Line
	for _, seg := range splitPath(path) {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		}
		var next *yaml.Node
		nextLine := 0
		switch {
		case seg.index >= 0 && n.Kind == yaml.SequenceNode && seg.index < len(n.Content):
			next = n.Content[seg.index]
			nextLine = next.Line
		case seg.index < 0 && n.Kind == yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == seg.name {
					next, nextLine = n.Content[i+1], n.Content[i].Line
					break
				}
			}
		}
		if next == nil {
			return line
		}
		n, line = next, nextLine
	}
	return line
}

type segment struct {
	name  string
	index int // -1 for a field
}

func splitPath(path string) []segment {
	var out []segment
	for _, part := range strings.Split(path, ".") {
		name, rest, _ := strings.Cut(part, "[")
		if name != "" {
			out = append(out, segment{name: name, index: -1})
		}
		for rest != "" {
			num, after, _ := strings.Cut(rest, "]")
			i, err := strconv.Atoi(num)
			if err != nil {
				break
			}
			out = append(out, segment{index: i})
			rest = strings.TrimPrefix(after, "[")
		}
	}
	return out
}
