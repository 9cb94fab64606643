package podenv

import "strings"

// Expand replaces $(NAME) references in s with lookup's value, as kubelet
// does for env values, command, args and subPathExpr: "$$" is a literal "$",
// a reference lookup does not know is left as written, and "$" followed by
// anything else (or an unclosed "$(") is kept.
func Expand(s string, lookup func(name string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch next := s[i+1]; next {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				// Unclosed: keep "$(" and scan on from after it.
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
			b.WriteByte(next)
			i++
		}
	}
	return b.String()
}
