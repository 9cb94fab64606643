package nfttest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/outpost-edge/outpost/netproxy/nft"
)

// TestEveryStatementHasAFake: each statement type of netproxy/nft (a type
// with an encode method) has its entry in stmtKinds, so a new statement
// cannot reach the Fake and the tracer unknown.
func TestEveryStatementHasAFake(t *testing.T) {
	files, err := filepath.Glob("../nft/*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var stmts []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Name.Name != "encode" {
				continue
			}
			if id, ok := fn.Recv.List[0].Type.(*ast.Ident); ok {
				stmts = append(stmts, id.Name)
			}
		}
	}
	var known []string
	pkg := reflect.TypeFor[nft.Rule]().PkgPath()
	for typ := range stmtKinds {
		if typ.PkgPath() == pkg {
			known = append(known, typ.Name())
		}
	}
	slices.Sort(stmts)
	slices.Sort(known)
	if len(stmts) == 0 || !slices.Equal(stmts, known) {
		t.Errorf("statement types of netproxy/nft: %v; stmtKinds knows %v", stmts, known)
	}
}
