use std::time::Instant;
fn main() {
    let ns = std::path::PathBuf::from(std::env::args().nth(1).unwrap());
    let mut v = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        aliasnet_shaper::netns::run_in(&ns, || 1).unwrap();
        v.push(t.elapsed().as_micros());
    }
    let mut w = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        std::thread::scope(|s| s.spawn(|| 1).join().unwrap());
        w.push(t.elapsed().as_micros());
    }
    v.sort();
    w.sort();
    println!(
        "run_in p50 {} p90 {} max {} us; plain thread p50 {} p90 {}",
        v[25], v[45], v[49], w[25], w[45]
    );
}
