//! Lets the binary find libtorch at run time without LD_LIBRARY_PATH: the
//! folder flodl-sys linked against (`LIBTORCH_PATH`, laid out by
//! scripts/libtorch-cpu) goes into its run path.

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH_PATH");
    if let Ok(dir) = std::env::var("LIBTORCH_PATH") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}/lib");
    }
}
