// Command mkimage writes the test image tarball (see env.WriteTestImage)
// for the demo and the test scripts.
//
//	go run ./test/e2e/env/mkimage -o image.tar amd64=/bin/busybox arm64=/path/to/busybox
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/outpost-edge/outpost/test/e2e/env"
)

func main() {
	out := flag.String("o", "busybox-image.tar", "output tarball")
	flag.Parse()
	bins := map[string]string{}
	for _, a := range flag.Args() {
		arch, path, ok := strings.Cut(a, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "mkimage: %q is not ARCH=PATH\n", a)
			os.Exit(2)
		}
		bins[arch] = path
	}
	if len(bins) == 0 {
		fmt.Fprintln(os.Stderr, "mkimage: give at least one ARCH=PATH to a static busybox")
		os.Exit(2)
	}
	f, err := os.Create(*out)
	if err == nil {
		err = env.WriteTestImage(f, bins)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Println(env.TestImage, "written to", *out)
}
